"""Draft and target of one family whose vocabularies are padded to different sizes (Qwen2.5-0.5B: 151,936 logit
rows, Qwen2.5-7B: 152,064): with their tokenizers compared and equal, the draft's logits are cut or padded with
-inf to the target's rows; greedy output is the target's, and sampling keeps its distribution (q is 0 on rows
the draft lacks). Before, any difference in ``vocab_size`` was refused."""


import pytest
import torch

import hf_spec

from .conftest import tiny_llama
from .test_sampling_exact import ALPHA, PROMPT, V, exact_distribution, processors, pvalue, sample_counts



class Tok:
    """A stand-in tokenizer: the same token -> id map for target and draft (what the CLI compares)."""

    def __init__(self, vocab):
        self.vocab = vocab
        self.name_or_path = "tiny"

    def get_vocab(self):
        return dict(self.vocab)

    def __len__(self):
        return len(self.vocab)


def padded_draft(rows: int, seed: int):
    """A draft whose first V rows are a perturbed copy of the target's and whose other rows are padding."""
    draft = tiny_llama(vocab_size=rows, seed=seed)
    with torch.no_grad():
        draft.lm_head.weight.mul_(12.0)
    return draft


@pytest.fixture(scope="module")
def target():
    model = tiny_llama(vocab_size=V, seed=10)
    with torch.no_grad():
        model.lm_head.weight.mul_(12.0)
    return model


@pytest.mark.parametrize("rows", [V + 6, V - 2])
def test_greedy_identical_with_a_padded_draft(target, rows):
    tok = Tok({f"t{i}": i for i in range(V)})
    ref = target.generate(PROMPT, max_new_tokens=20, do_sample=False)
    for k in (1, 3):
        drafter = hf_spec.DraftModelDrafter(padded_draft(rows, 11), k, tokenizer=tok, draft_tokenizer=tok)
        out = target.generate(PROMPT, max_new_tokens=20, do_sample=False, custom_generate=hf_spec.generate, return_dict_in_generate=True,
                              drafter=drafter)
        assert out.sequences.tolist() == ref.tolist()
        assert out.stats.num_draft_tokens > 0


def test_sampling_exact_with_a_padded_draft(target):
    tok = Tok({f"t{i}": i for i in range(V)})
    procs = processors(1.0)
    drafter = hf_spec.DraftModelDrafter(padded_draft(V + 6, 11), 2, tokenizer=tok, draft_tokenizer=tok)
    counts = sample_counts(target, None, procs, seed=31, drafter=drafter)
    assert pvalue(counts, exact_distribution(target, procs)) > ALPHA


def test_different_rows_without_tokenizers_are_refused_with_what_to_pass(target):
    with pytest.raises(hf_spec.VocabularyMismatchError, match=r"DraftModelDrafter\(draft, tokenizer=..., draft_tokenizer=...\)"):
        target.generate(PROMPT, max_new_tokens=4, custom_generate=hf_spec.generate, return_dict_in_generate=True,
                        drafter=hf_spec.DraftModelDrafter(padded_draft(V + 6, 11), 2))
    with pytest.raises(hf_spec.VocabularyMismatchError, match="differs from the target tokenizer.*suffix or ngram "
                       "drafter.*assistant_tokenizer="):
        hf_spec.DraftModelDrafter(padded_draft(V + 6, 11), 2, tokenizer=Tok({"a": 0}), draft_tokenizer=Tok({"b": 0}))
