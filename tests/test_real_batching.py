"""Batched greedy exactness on the real SmolLM2-135M-Instruct (float32): for batch sizes 2 and 8,
left-padded prompts of very different lengths (a few tokens of question to a long article) and rows that
end early on EOS, every row's output is token-identical to that prompt's unbatched ``model.generate``,
for the n-gram drafter and two real-weight drafts (high and low acceptance), through both entry points.

As in ``test_real_greedy.py``, a divergence is allowed only at a numerical near-tie (top-2 logit gap under
TIE_BOUND in float32): a batched forward uses other matmul shapes than a single row's."""

import pytest
import torch

import hf_spec
from hf_spec.prompts import chat_inputs, load_questions

from .conftest import TIE_BOUND, top2_gap

pytestmark = pytest.mark.slow
NEW = 40
SHORT = ["Reply with the single word: yes.", "What is 2 + 2? Answer with a number only.", "Say hello."]


@pytest.fixture(scope="module")
def cases(smol):
    """8 prompts (short-answer ones that end on EOS, Spec-Bench ones, one long article) and their
    unbatched greedy outputs."""
    model, tok = smol
    long = [q for q in load_questions(categories=["summarization"]) if 1500 < len(q.text) < 3500][0]
    qs = load_questions(categories=["coding", "writing", "math", "translation"], per_category=1)
    texts = [SHORT[0], long.text, qs[0].text, SHORT[1], qs[1].text, qs[2].text, SHORT[2], qs[3].text]
    out = []
    for t in texts:
        enc = chat_inputs(tok, t)
        seq = model.generate(**enc, max_new_tokens=NEW, do_sample=False)
        out.append((t, enc["input_ids"][0], seq[0, enc["input_ids"].shape[1]:]))
    lengths = [len(ids) for _, ids, _ in out]
    assert max(lengths) > 6 * min(lengths)
    assert sum(len(new) < NEW for _, _, new in out) >= 2  # rows that end early on EOS
    return out


def check_row(model, prompt_ids, got_new, ref_new, pad, label):
    got = got_new.tolist()
    ref = ref_new.tolist()
    assert all(t == pad for t in got[len(ref):]), f"{label}: tokens after the row's end are not padding"
    got = got[: len(ref)]
    if got == ref:
        return 0
    j = next(i for i, (a, b) in enumerate(zip(got, ref)) if a != b)
    gap = top2_gap(model, torch.cat([prompt_ids, ref_new[:j]])[None])
    assert gap < TIE_BOUND, f"{label}: first divergence at new token {j} is no near-tie (gap {gap:.2e})"
    return 1


@pytest.mark.parametrize("batch_size", [2, 8])  # a row alone: test_real_greedy.py
def test_each_row_equals_its_unbatched_generate(smol, smol_drafts, cases, batch_size):
    model, tok = smol
    batch = cases[:batch_size]
    enc = chat_inputs(tok, [t for t, _, _ in batch])
    width = enc["input_ids"].shape[1]
    pad = model.generation_config.pad_token_id
    pad = pad if pad is not None else model.generation_config.eos_token_id
    ties = 0
    for name, drafter in [("ngram k=4", hf_spec.NgramDrafter(4)),
                          ("draft-bf16 k=5", hf_spec.DraftModelDrafter(smol_drafts["bf16"], 5)),
                          ("draft-skip k=3", hf_spec.DraftModelDrafter(smol_drafts["skip"], 3))]:
        out = model.generate(**enc, max_new_tokens=NEW, do_sample=False, custom_generate=hf_spec.generate, return_dict_in_generate=True,
                             drafter=drafter)
        assert out.sequences.shape[0] == batch_size
        for b, (_, ids, ref) in enumerate(batch):
            ties += check_row(model, ids, out.sequences[b, width:], ref, pad, f"B={batch_size} {name} row {b}")
            assert out.stats.per_row.get(b, out.stats).num_emitted_tokens == len(ref)
        assert out.stats.num_emitted_tokens == sum(len(ref) for _, _, ref in batch)
    print(f"\nB={batch_size}: near-tie divergences {ties}")


def test_assistant_model_entry_point_takes_a_batch(smol, smol_drafts, cases):
    model, tok = smol
    hf_spec.enable_drafters(model)
    batch = cases[:3]
    enc = chat_inputs(tok, [t for t, _, _ in batch])
    seq = model.generate(**enc, max_new_tokens=NEW, do_sample=False,
                         assistant_model=hf_spec.DraftModelDrafter(smol_drafts["bf16"], 5))
    pad = model.generation_config.pad_token_id
    pad = pad if pad is not None else model.generation_config.eos_token_id
    for b, (_, ids, ref) in enumerate(batch):
        check_row(model, ids, seq[b, enc["input_ids"].shape[1]:], ref, pad, f"assistant row {b}")
