"""Batched speculative decoding (B > 1, left-padded prompts of different lengths).

Mechanics on tiny random models: the per-row cache with holes gives every row the logits it would get
alone; per-row sampling is distribution-exact (chi-square against enumeration, both drafters, and the same
test fails for a wrong rule); statistics per row add up. Greedy exactness on the real SmolLM2 is in
``test_real_batching.py``."""

import copy

import pytest
import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList
from transformers.generation import MaxLengthCriteria, TemperatureLogitsWarper, TopKLogitsWarper

import hf_spec
import hf_spec.acceptance
from hf_spec.kernels import quantize_draft_int4, quantize_draft_int8
from hf_spec.ragged import RaggedCache

from .conftest import tiny_llama, tiny_pair
from .test_acceptance import wrong_residual
from .test_sampling_exact import pvalue

ALPHA = 1e-3
V = 10
N_RUNS = 1200
NEW = 3
# three prompts of different lengths (the batch is left-padded to the longest)
PROMPTS = [[0, 4, 7], [0, 2, 5, 8, 3, 2, 5], [0, 6]]


def left_pad(prompts, pad=1):
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


@torch.no_grad()
def test_ragged_cache_rows_see_exactly_their_own_sequence(attention_path):
    """Feed a padded batch, then blocks with filler, roll back some tokens per row, feed again: each row's
    logits equal a plain forward over that row's true sequence, on transformers' attention path and on hf-spec's
    (one-position blocks with a 4D mask, several positions packed; conftest.attention_path)."""
    model = tiny_llama(vocab_size=V, seed=5)
    ids, mask = left_pad(PROMPTS)
    ragged = RaggedCache(model.config, 3, "cpu")
    ragged.forward(model, ids, mask.bool())
    seqs = [list(p) for p in PROMPTS]
    block = torch.tensor([[3, 4, 5, 6], [7, 8, 9, 2], [5, 5, 5, 5]])
    real = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)  # filler at the tail
    logits = ragged.forward(model, block, real, logits_to_keep=4).logits
    for b in range(3):
        for i in range(int(real[b].sum())):  # each real position's logits are those of its row alone
            alone = model(input_ids=torch.tensor([seqs[b] + block[b, :i + 1].tolist()])).logits[0, -1]
            torch.testing.assert_close(logits[b, i], alone, atol=1e-5, rtol=1e-5)
        seqs[b] += block[b, : int(real[b].sum())].tolist()
    on, packed = attention_path
    assert bool(packed) == on  # the 4-position block packed its query heads on hf-spec's path
    keep = torch.tensor([len(seqs[0]) - 2, len(seqs[1]), len(seqs[2]) - 1])  # roll back 2, 0, 1 tokens
    ragged.truncate(keep)
    seqs = [s[: int(n)] for s, n in zip(seqs, keep)]
    assert ragged.lengths.tolist() == [len(s) for s in seqs]
    nxt = torch.tensor([[2], [3], [4]])
    out = ragged.forward(model, nxt, logits_to_keep=1).logits[:, -1]
    for b in range(3):
        alone = model(input_ids=torch.tensor([seqs[b] + [int(nxt[b])]])).logits[0, -1]
        torch.testing.assert_close(out[b], alone, atol=1e-5, rtol=1e-5)
    # dropping a row keeps the others intact
    ragged.select(torch.tensor([0, 2]))
    out = ragged.forward(model, torch.tensor([[6], [6]])).logits[:, -1]
    for i, b in enumerate([0, 2]):
        alone = model(input_ids=torch.tensor([seqs[b] + [int(nxt[b]), 6]])).logits[0, -1]
        torch.testing.assert_close(out[i], alone, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_forwards_take_the_measured_attention_path(monkeypatch, attention_path):
    """A row without holes. A one-position block (a plain step, a draft model's drafting step): transformers' sdpa
    attention gets no mask, and so runs grouped-query attention with ``enable_gqa``, unless the measured choice
    (kernels.one_query_mask_pays) gave it a 4D mask. A block of several positions after cached ones (a verify
    forward): transformers repeats each key/value head per query head, unless the measured choice
    (kernels.packed_attention_pays) packed the query heads into the query length. Either way the logits are those
    of the row alone, and the model's attention implementation is its own again afterwards."""
    from transformers.integrations import sdpa_attention

    model = tiny_llama(vocab_size=V, seed=5)  # 4 query heads over 2 key/value heads of size 8
    seen, shapes = [], []
    real = sdpa_attention.use_gqa_in_sdpa
    monkeypatch.setattr(sdpa_attention, "use_gqa_in_sdpa", lambda m, k, v: seen.append((m is None, real(m, k, v)))
                        or seen[-1][1])
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda q, k, v, **kw: shapes.append((tuple(q.shape), k.shape[1])) or sdpa(q, k, v, **kw))
    ragged = RaggedCache(model.config, 1, "cpu")
    seq = [0, 4, 7, 2, 5]
    ragged.forward(model, torch.tensor([seq]))
    layers = model.config.num_hidden_layers
    for token in (3, 8, 6):
        seen.clear()
        seq.append(token)
        out = ragged.forward(model, torch.tensor([[token]])).logits[0, -1]
        assert seen == [(not attention_path[0], not attention_path[0])] * layers
        torch.testing.assert_close(out, model(input_ids=torch.tensor([seq])).logits[0, -1], atol=1e-5, rtol=1e-5)
    shapes.clear()
    block = [9, 3, 4]
    out = ragged.forward(model, torch.tensor([block]), logits_to_keep=3).logits[0]
    # packed: [B, kv heads, groups x 3 queries, d] against 2 key/value heads; else 4 heads of 3 queries against 4
    assert shapes == [((1, 2, 6, 8), 2) if attention_path[0] else ((1, 4, 3, 8), 4)] * layers
    assert model.config._attn_implementation == "sdpa"
    torch.testing.assert_close(out, model(input_ids=torch.tensor([seq + block])).logits[0, -3:], atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def pair():
    target, draft = tiny_llama(vocab_size=V, seed=10), tiny_llama(vocab_size=V, seed=11)
    with torch.no_grad():
        target.lm_head.weight.mul_(12.0)
        draft.lm_head.weight.mul_(12.0)
    return target, draft


def procs():
    return LogitsProcessorList([TemperatureLogitsWarper(1.0), TopKLogitsWarper(5)])


@torch.no_grad()
def exact_distribution(model, prompt):
    """P(t1, t2, t3 | prompt) under the processed target distribution, by enumeration."""
    out = {}

    def p(prefix):
        x = torch.tensor([prefix])
        return procs()(x, model(input_ids=x).logits[:, -1].float()).softmax(-1)[0]

    p1 = p(prompt)
    for a in p1.nonzero().flatten().tolist():
        p2 = p(prompt + [a])
        for b in p2.nonzero().flatten().tolist():
            p3 = p(prompt + [a, b])
            for c in p3.nonzero().flatten().tolist():
                out[(a, b, c)] = float(p1[a] * p2[b] * p3[c])
    return out


def batched_counts(target, drafter, seed):
    torch.manual_seed(seed)
    ids, mask = left_pad(PROMPTS)
    cfg = GenerationConfig(do_sample=True, max_length=ids.shape[1] + NEW + 1, pad_token_id=1)
    stop = StoppingCriteriaList([MaxLengthCriteria(cfg.max_length)])
    counts = [{} for _ in PROMPTS]
    for _ in range(N_RUNS):
        out = hf_spec.speculative_decode(target, ids, drafter, attention_mask=mask, logits_processor=procs(),
                                         stopping_criteria=stop, generation_config=cfg)
        for b in range(len(PROMPTS)):
            key = tuple(out.sequences[b, ids.shape[1]: ids.shape[1] + NEW].tolist())
            counts[b][key] = counts[b].get(key, 0) + 1
    return counts


@pytest.mark.parametrize("drafter_name", ["draft", "ngram"])
def test_batched_sampling_is_distribution_exact_per_row(pair, drafter_name):
    target, draft = pair
    drafter = hf_spec.DraftModelDrafter(draft, 2) if drafter_name == "draft" else hf_spec.NgramDrafter(2, max_ngram=2)
    counts = batched_counts(target, drafter, seed=7)
    for b, prompt in enumerate(PROMPTS):
        assert pvalue(counts[b], exact_distribution(target, prompt)) > ALPHA, f"row {b}"


def test_batched_sampling_test_fails_for_a_wrong_rule(pair, monkeypatch):
    target, draft = pair
    monkeypatch.setattr(hf_spec.acceptance, "_residual", wrong_residual)
    counts = batched_counts(target, hf_spec.DraftModelDrafter(draft, 2), seed=8)
    assert min(pvalue(counts[b], exact_distribution(target, p)) for b, p in enumerate(PROMPTS)) < ALPHA


def test_batched_greedy_equals_each_row_alone_and_stats_add_up():
    """Tiny-model mechanics: rows of different lengths, one ending early on EOS, several k; the draft model in
    float32, made int8 (``draft_dtype="int8"``) and in bfloat16 with int4 weights (``draft_dtype="int4"``)."""
    target, draft = tiny_pair()
    int8_draft = copy.deepcopy(draft)
    quantize_draft_int8(int8_draft)
    int4_draft = copy.deepcopy(draft).to(torch.bfloat16)
    assert quantize_draft_int4(int4_draft) == 2 * 7 + 1  # every linear layer drafts in int4
    prompts = [[0, 5, 9, 5, 9, 5, 3], [0, 7], [0, 11, 5, 9, 5, 9, 5, 3, 7, 11, 5, 9], [0, 3, 3]]
    ids, mask = left_pad(prompts)
    # an extra EOS token that row 1 emits early, so that rows end at different steps
    eos = [1, target.generate(torch.tensor([prompts[1]]), max_new_tokens=3, do_sample=False)[0, -1].item()]
    alone = [target.generate(torch.tensor([p]), max_new_tokens=20, do_sample=False, eos_token_id=eos)[0, len(p):].tolist()
             for p in prompts]
    assert min(len(a) for a in alone) <= 3 and max(len(a) for a in alone) == 20
    for k in (1, 3, 6):
        for drafter in (hf_spec.DraftModelDrafter(draft, k), hf_spec.DraftModelDrafter(int8_draft, k),
                        hf_spec.DraftModelDrafter(int4_draft, k), hf_spec.NgramDrafter(k)):
            events = []
            out = target.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, eos_token_id=eos,
                                  custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=drafter, event_listeners=[events.append])
            for b, a in enumerate(alone):
                row = out.sequences[b, ids.shape[1]:].tolist()
                assert row[: len(a)] == a, f"k={k} {drafter.method} row {b}"
                assert all(t == 1 for t in row[len(a):])  # right-padded (pad_token_id 1) after its end
                assert out.stats.per_row[b].num_emitted_tokens == len(a)
            assert out.stats.num_emitted_tokens == sum(len(a) for a in alone)
            assert sum(s.num_accepted_tokens for s in out.stats.per_row.values()) == out.stats.num_accepted_tokens
            # a finished row leaves the batch: later events list only the running rows
            assert [len(e.rows) for e in events] == sorted((len(e.rows) for e in events), reverse=True)


@pytest.mark.parametrize("name", ["draft", "ngram", "medusa"])
def test_batch_processors_with_per_row_state_match_batched_generate(name):
    """The processors a shipped generation config or a call turns on that keep per-row state: a repetition
    penalty (which ignores each row's own left padding), the encoder penalties (each row's prompt),
    ``prefix_allowed_tokens_fn`` (each row's batch id). Greedy output equals the target's own batched
    ``generate`` row by row, with one row leaving the batch early on EOS; before, the batch crashed
    (``Incompatible prompt_ignore_length batch size``) or decoded every row under row 0's constraint."""
    from .test_medusa import random_heads

    target, draft = tiny_pair()
    prompts = [[0, 5, 9, 5, 9, 5, 3], [0, 7], [0, 11, 5, 9, 5, 9, 5, 3, 7, 11, 5, 9]]
    ids, mask = left_pad(prompts)
    eos = [1, target.generate(torch.tensor([prompts[1]]), max_new_tokens=3, do_sample=False)[0, -1].item()]

    def allowed(batch_id, sent):  # each row decodes from its own half of the vocabulary... and row 1 may end
        return list(range(16)) if batch_id != 2 else list(range(16, 32)) + [eos[1]]

    settings = [dict(repetition_penalty=1.3), dict(encoder_repetition_penalty=1.5, encoder_no_repeat_ngram_size=2),
                dict(prefix_allowed_tokens_fn=allowed, repetition_penalty=1.1)]
    for kw in settings:
        ref = target.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False, eos_token_id=eos, **kw)
        for k in (1, 3):
            drafter = {"draft": lambda: hf_spec.DraftModelDrafter(draft, k), "ngram": lambda: hf_spec.NgramDrafter(k),
                       "medusa": lambda: hf_spec.MedusaDrafter(random_heads(n=3, seed=1).bind(target), k)}[name]()
            out = target.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False, eos_token_id=eos,
                                  custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=drafter, **kw)
            assert out.sequences.tolist() == ref.tolist(), (kw, k)


def test_prefix_allowed_tokens_fn_with_num_return_sequences_gets_each_prompts_batch_id():
    """generate builds prefix_allowed_tokens_fn's processor for rows in groups of num_return_sequences and passes the
    prompt's index as batch_id; the per-row view had divided one row by the group (batch size 0) and crashed. Each
    prompt's samples must keep to that prompt's constraint (even tokens for prompt 0, odd for prompt 1)."""
    target, draft = tiny_pair()
    ids, mask = left_pad([[0, 5, 9, 5, 9, 5, 3], [0, 7, 11, 7]])
    seen = set()

    def allowed(batch_id, sent):
        seen.add(batch_id)
        return list(range(batch_id % 2, 32, 2))

    for drafter in (hf_spec.DraftModelDrafter(draft, 3), hf_spec.NgramDrafter(3)):
        torch.manual_seed(0)
        out = target.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=True, num_return_sequences=3,
                              prefix_allowed_tokens_fn=allowed, eos_token_id=None, custom_generate=hf_spec.generate,
                              drafter=drafter)
        assert seen == {0, 1}
        new = out[:, ids.shape[1]:]
        assert new.shape == (6, 8) and all(t % 2 == row // 3 for row in range(6) for t in new[row].tolist())


@pytest.mark.parametrize("order", ["instruct", "warper-first", "reads-last"])
def test_process_scores_equals_each_row_processed_by_transformers(order):
    """process_scores over many rows (a sampled verify step: every row and position in one call) gives bit for bit
    what each row's processors give that row alone, whatever the order of sequence-reading processors and
    score-only warpers (the warpers after the last sequence-reading one run once on all rows)."""
    from transformers import LogitsProcessorList
    from transformers.generation.logits_process import (MinPLogitsWarper, NoRepeatNGramLogitsProcessor,
                                                        RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper,
                                                        TopKLogitsWarper, TopPLogitsWarper)

    from hf_spec.processors import process_scores, row_processors

    made = {"instruct": lambda: [RepetitionPenaltyLogitsProcessor(1.3), TemperatureLogitsWarper(0.7),
                                 TopKLogitsWarper(8), TopPLogitsWarper(0.8)],
            "warper-first": lambda: [TemperatureLogitsWarper(0.5), RepetitionPenaltyLogitsProcessor(1.5),
                                     NoRepeatNGramLogitsProcessor(2), TopPLogitsWarper(0.9), MinPLogitsWarper(0.05)],
            "reads-last": lambda: [TopKLogitsWarper(10), RepetitionPenaltyLogitsProcessor(2.0)]}[order]
    torch.manual_seed(0)
    vocab = 40
    sequences = [torch.randint(0, vocab, (n,)) for n in (3, 7, 7, 12, 1)]
    scores = torch.randn(len(sequences), vocab) * 3
    processors = LogitsProcessorList(made())
    expected = torch.cat([LogitsProcessorList(made())(seq[None], scores[i:i + 1]) for i, seq in enumerate(sequences)])
    assert torch.equal(process_scores(processors, sequences, scores), expected)
    per_row = row_processors(processors, len(sequences), padded=False)  # views of one batch's processors
    assert torch.equal(process_scores(per_row, sequences, scores), expected)
    assert torch.equal(process_scores(processors, sequences[:1], scores[:1]), expected[:1])


def test_classifier_free_guidance_is_refused_with_a_drafter():
    """guidance_scale builds a processor with its own unconditional cache, fed one token per call: it cannot
    follow k+1 verified positions or a rollback, so a drafter with it is refused (plain decoding still runs)."""
    target, draft = tiny_pair()
    with pytest.raises(ValueError, match="classifier-free guidance"):
        target.generate(torch.tensor([PROMPTS[1]]), max_new_tokens=6, do_sample=False, guidance_scale=1.5,
                        custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=hf_spec.DraftModelDrafter(draft, 2))
    ref = target.generate(torch.tensor([PROMPTS[1]]), max_new_tokens=6, do_sample=False, guidance_scale=1.5)
    out = target.generate(torch.tensor([PROMPTS[1]]), max_new_tokens=6, do_sample=False, guidance_scale=1.5,
                          custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=None)
    assert out.sequences.tolist() == ref.tolist()
