"""The draft model's confidence stop (``DraftModelDrafter(confidence_threshold=...)``): a row stops drafting after
a token the draft gave less than the threshold, per row, against a brute-force reference; the output stays the
target's (greedy identical in a ragged batch, sampling distribution-exact with stops happening)."""

import pytest
import torch
from transformers import GenerationConfig

import hf_spec

from .conftest import tiny_llama, tiny_pair
from .test_sampling_exact import V, exact_distribution, processors, pvalue, sample_counts


@pytest.fixture(scope="module")
def peaky_pair():
    """tiny_pair with sharper logits, so the draft is sure of some tokens and unsure of others."""
    target, draft = tiny_pair()
    with torch.no_grad():
        target.lm_head.weight.mul_(6.0)
        draft.lm_head.weight.mul_(6.0)
    return target, draft


@torch.no_grad()
def reference_lengths(draft, rows, k, threshold):
    """Per row: how many tokens greedy drafting proposes, by running the draft on the whole prefix each time."""
    lengths = []
    for row in rows:
        seq = row.clone()
        for i in range(k):
            p = draft(input_ids=seq[None]).logits[0, -1].float().softmax(-1)
            token = p.argmax()
            if p[token] < threshold or i == k - 1:
                lengths.append(i + 1)
                break
            seq = torch.cat([seq, token[None]])
    return lengths


def test_each_row_stops_after_the_first_token_its_draft_doubts(peaky_pair):
    target, draft = peaky_pair
    torch.manual_seed(5)
    rows = [torch.randint(2, 32, (n,)) for n in (5, 9, 7, 6)]
    k = 6
    # a threshold at the median of the first tokens' confidences: some rows stop early, some do not
    with torch.no_grad():
        first = [float(draft(input_ids=r[None]).logits[0, -1].softmax(-1).max()) for r in rows]
    threshold = sorted(first)[len(first) // 2]
    expected = reference_lengths(draft, rows, k, threshold)
    assert len(set(expected)) > 1, expected  # the test's power: rows stop at different lengths
    padded = torch.nn.utils.rnn.pad_sequence([r.flip(0) for r in rows], batch_first=True, padding_value=1).flip(1)
    session = hf_spec.DraftModelDrafter(draft, k, confidence_threshold=threshold).start(
        target, padded, GenerationConfig(do_sample=False))
    tokens, num_drafted, _ = session.draft(rows, k)
    assert num_drafted.tolist() == expected
    assert tokens.shape[1] == max(expected)  # drafting ends when every row has stopped
    # no threshold: k tokens for every row, and the same tokens where both drafted
    plain = hf_spec.DraftModelDrafter(draft, k, confidence_threshold=0.0).start(target, padded,
                                                                              GenerationConfig(do_sample=False))
    all_tokens, all_drafted, _ = plain.draft(rows, k)
    assert all_drafted.tolist() == [k] * len(rows)
    for b, n in enumerate(expected):
        assert torch.equal(tokens[b, :n], all_tokens[b, :n])


@pytest.mark.parametrize("k", [4, "auto"])
def test_a_confidence_stop_keeps_greedy_output_identical_in_a_ragged_batch(peaky_pair, k):
    target, draft = peaky_pair
    torch.manual_seed(2)
    rows = [torch.randint(2, 32, (n,)) for n in (4, 8, 6)]
    ids = torch.nn.utils.rnn.pad_sequence([r.flip(0) for r in rows], batch_first=True, padding_value=1).flip(1)
    mask = (torch.arange(ids.shape[1]) >= ids.shape[1] - torch.tensor([len(r) for r in rows])[:, None]).long()
    ref = target.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False)
    events = []
    out = target.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False,
                          custom_generate=hf_spec.generate, return_dict_in_generate=True, num_speculative_tokens=k,
                          drafter=hf_spec.DraftModelDrafter(draft, 4, confidence_threshold=0.12),
                          event_listeners=[events.append])
    assert torch.equal(out.sequences, ref)
    lengths = [[len(d) for d in e.drafted] for e in events if e.num_speculative_tokens > 1]
    assert any(len(set(row)) > 1 for row in lengths), lengths  # rows of one step stopped at different lengths
    assert any(n > 1 for row in lengths for n in row), lengths  # multi-token drafts, not one token a step


def test_a_confidence_stop_keeps_sampling_distribution_exact(monkeypatch):
    """Stopping is a function of the tokens drafted so far (a stopping time), so speculative sampling stays exact;
    the threshold makes ~half the first drafted tokens stop the draft, so both lengths are verified."""
    target, draft = tiny_llama(vocab_size=V, seed=10), tiny_llama(vocab_size=V, seed=11)
    with torch.no_grad():
        target.lm_head.weight.mul_(12.0)
        draft.lm_head.weight.mul_(12.0)
    procs = processors(1.0)
    exact = exact_distribution(target, procs)
    drafter = hf_spec.DraftModelDrafter(draft, 2, confidence_threshold=0.3)
    drafted = []
    original = hf_spec.DraftModelDrafter.draft

    def spy(self, sequences, k):
        out = original(self, sequences, k)
        drafted.append(int(out[1][0]))
        return out

    monkeypatch.setattr(hf_spec.DraftModelDrafter, "draft", spy)
    counts = sample_counts(target, draft, procs, seed=4, drafter=drafter)
    share = drafted.count(1) / len(drafted)
    assert 0.1 < share < 0.9, share  # the test's power: drafts of 1 and of 2 tokens both happen
    assert pvalue(counts, exact) > 1e-3


@pytest.mark.parametrize("bad", [-0.1, 1.0, float("nan")])
def test_a_bad_confidence_threshold_is_refused(bad):
    _, draft = tiny_pair()
    with pytest.raises(ValueError, match="confidence_threshold"):
        hf_spec.DraftModelDrafter(draft, 3, confidence_threshold=bad)


def test_with_the_stop_a_draft_models_k_is_a_cap_of_6():
    """k is the most a row drafts once the draft stops where unsure: 6 by default (docs/benchmarks.md); without
    the stop the shared default 3, which a drafting-every-token draft model measured best."""
    from hf_spec.drafters.base import DEFAULT_NUM_SPECULATIVE_TOKENS
    from hf_spec.drafters.draft_model import DEFAULT_CONFIDENCE_THRESHOLD

    _, draft = tiny_pair()
    assert DEFAULT_CONFIDENCE_THRESHOLD == 0.5
    assert hf_spec.DraftModelDrafter(draft).num_speculative_tokens == 6
    assert hf_spec.DraftModelDrafter.spec_num_speculative_tokens("some/model") == 6  # what the bench and CLI use
    assert hf_spec.DraftModelDrafter(draft, confidence_threshold=0.0).num_speculative_tokens == \
        DEFAULT_NUM_SPECULATIVE_TOKENS == 3
    assert hf_spec.DraftModelDrafter(draft, 2).num_speculative_tokens == 2  # a given k is kept
    assert hf_spec.HybridDrafter(hf_spec.DraftModelDrafter(draft)).num_speculative_tokens == 6
    assert hf_spec.NgramDrafter().num_speculative_tokens == 3


@pytest.mark.parametrize("threshold, controller, ks", [
    (0.12, "auto", {4}),  # with the stop, k is a cap: auto keeps the drafter's k (on or off only)
    (0.0, "auto", None),  # without it, auto starts at k_min and measures larger k
    (0.12, hf_spec.AdaptiveK(k_max=3), {3}),  # within k_max
])
def test_auto_keeps_the_k_of_a_drafter_that_stops_when_unsure(peaky_pair, monkeypatch, threshold, controller, ks):
    # the draft's catch-up judgment compares measured seconds (tested with synthetic ones in test_adaptive.py): on a
    # busy CPU a slow prefill once switched this call off before its first draft (fast lane, 2026-12-02)
    monkeypatch.setattr(hf_spec.AdaptiveK, "catch_up_pays", lambda self, k, catch_up_s, remaining_tokens: True)
    target, draft = peaky_pair
    drafter = hf_spec.DraftModelDrafter(draft, 4, confidence_threshold=threshold)
    assert drafter.stops_when_unsure == (threshold > 0)
    assert hf_spec.HybridDrafter(drafter).stops_when_unsure == drafter.stops_when_unsure
    ids = torch.randint(2, 32, (1, 7), generator=torch.Generator().manual_seed(3))
    events = []
    out = target.generate(ids, max_new_tokens=24, do_sample=False, custom_generate=hf_spec.generate,
                          return_dict_in_generate=True, num_speculative_tokens=controller, drafter=drafter,
                          event_listeners=[events.append])
    used = [e.num_speculative_tokens for e in events if e.num_speculative_tokens > 0]
    if ks is None:
        assert used and used[0] == 1, [(e.num_speculative_tokens, e.policy) for e in events]
    else:
        # every step runs the kept k, but the last ones, where the tokens left before max_length may cut it
        (kept,) = ks
        assert len(used) > 2 and set(used[:-2]) == ks and max(used) == kept, \
            [(e.num_speculative_tokens, e.policy) for e in events]
    assert torch.equal(out.sequences, target.generate(ids, max_new_tokens=24, do_sample=False))


def test_a_calibration_schedule_still_cycles_every_k_of_a_drafter_that_stops(peaky_pair):
    """CycleK (what ``hf-spec tune`` calibrates with) is a schedule, not a policy: keeping a stopping drafter's k
    does not apply to it, or tune would calibrate the cap alone."""
    target, draft = peaky_pair
    ids = torch.randint(2, 32, (1, 7), generator=torch.Generator().manual_seed(3))
    events = []
    target.generate(ids, max_new_tokens=24, do_sample=False, custom_generate=hf_spec.generate,
                    return_dict_in_generate=True, num_speculative_tokens=hf_spec.adaptive.CycleK(1, 3),
                    drafter=hf_spec.DraftModelDrafter(draft, 4, confidence_threshold=0.12),
                    event_listeners=[events.append])
    # (a last step with no token left to draft before max_length runs k = 0)
    assert {e.num_speculative_tokens for e in events if e.num_speculative_tokens > 0} == {1, 2, 3}
