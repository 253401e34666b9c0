"""Mechanics of the loop on tiny random models: exactness at every k and length edge case, statistics
identities, streaming, and clear errors for bad input."""

import copy
import pytest
import torch
from transformers import GenerationConfig
from transformers.generation.streamers import BaseStreamer

import hf_spec
from hf_spec.ragged import cache_kwarg, crop_cache_to

from .conftest import first_divergence, tiny_llama, tiny_pair, top2_gap, TIE_BOUND


@pytest.fixture(scope="module")
def tiny():
    return tiny_pair()


PROMPT = torch.tensor([[0, 5, 9, 5, 9, 5, 3, 7, 11, 5, 9]])


def _drafters(draft, k):
    return [hf_spec.DraftModelDrafter(draft, k), hf_spec.NgramDrafter(k)]


@pytest.mark.parametrize("k", [1, 3, 5, 8])
def test_greedy_identical_at_length_edges(tiny, k):
    target, draft = tiny
    for max_new in sorted({1, max(k - 1, 1), k, k + 1, 24}):
        base = target.generate(PROMPT, max_new_tokens=max_new, do_sample=False)
        for d in _drafters(draft, k):
            out = target.generate(PROMPT, max_new_tokens=max_new, do_sample=False,
                                  custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=d)
            assert out.sequences.shape[1] <= PROMPT.shape[1] + max_new
            j = first_divergence(out.sequences, base, PROMPT.shape[1])
            if j is not None:  # allowed only at a numerical near-tie
                assert top2_gap(target, base[:, :j]) < TIE_BOUND, (type(d).__name__, k, max_new, j)


def test_statistics_identities(tiny):
    target, draft = tiny
    for d in _drafters(draft, 4):
        out = target.generate(PROMPT, max_new_tokens=30, do_sample=False, custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=d)
        s = out.stats
        assert s.new_tokens == out.sequences.shape[1] - PROMPT.shape[1]
        assert s.num_emitted_tokens == s.num_accepted_tokens + s.num_row_steps
        assert s.num_row_steps == s.num_target_forwards  # batch size 1
        assert s.acceptance_rate == pytest.approx(s.num_accepted_tokens / max(s.num_draft_tokens, 1))
        assert sum(s.accepted_per_position) == s.num_accepted_tokens
        assert sum(s.drafted_per_position) == s.num_draft_tokens
        assert all(a <= b for a, b in zip(s.accepted_per_position[1:], s.accepted_per_position))
        assert s.mean_accepted_length == pytest.approx((s.new_tokens - 1) / (s.num_target_forwards - 1))
        assert 0 < s.ttft_s <= s.total_s


def test_a_listener_kept_over_calls_counts_them_as_merge_does(tiny):
    """One SpecStats passed as event listener to several calls (the user guide's way without
    return_dict_in_generate): its times were the last call's (total_s, ttft_s), so tokens/s read 4.7x too high in a
    break-it run, and per_row added rows of different calls by index. Now every figure is merge()'s over the calls'
    own statistics, and per_row is the last call's rows."""
    target, draft = tiny
    batch = torch.tensor([[1, 1, 0, 5, 9, 5], [0, 4, 8, 12, 4, 8]])
    calls = [dict(inputs=PROMPT), dict(inputs=batch, attention_mask=(batch != 1).long()), dict(inputs=PROMPT[:, :6]),
             dict(inputs=batch, attention_mask=(batch != 1).long())]
    kept, merged = hf_spec.SpecStats(), hf_spec.SpecStats()
    for kw in calls:
        out = target.generate(**kw, max_new_tokens=12, do_sample=False, custom_generate=hf_spec.generate,
                              return_dict_in_generate=True, drafter=hf_spec.NgramDrafter(3), event_listeners=[kept])
        merged.merge(out.stats)
    last = out.stats
    for name in ("num_emitted_tokens", "num_sequences", "num_target_forwards", "num_draft_tokens",
                 "num_accepted_tokens", "decode_tokens", "k_per_step", "accepted_per_position"):
        assert getattr(kept, name) == getattr(merged, name), name
    for name in ("total_s", "ttft_s", "decode_s", "tokens_per_s", "tpot_s"):
        assert getattr(kept, name) == pytest.approx(getattr(merged, name), rel=1e-9), name
    assert kept.total_s > last.total_s
    assert {r: s.num_emitted_tokens for r, s in kept.per_row.items()} == \
        {r: s.num_emitted_tokens for r, s in last.per_row.items()}
    # TTFT is summed over calls; the summary prints the mean per call (it printed the sum as one call's TTFT)
    assert kept.num_calls == merged.num_calls == len(calls) and last.num_calls == 1
    assert kept.mean_ttft_s == pytest.approx(kept.ttft_s / len(calls))
    assert f"TTFT {kept.mean_ttft_s * 1000:.0f} ms (mean of 4 calls)" in kept.summary()
    assert f"TTFT {last.ttft_s * 1000:.0f} ms, TPOT" in last.summary()


def test_tpot_is_per_sequence_in_a_batch_and_across_merged_calls(tiny):
    """A batch's TPOT was its wall time over all its rows' tokens, below every row's own (rows decode at the same
    time), and merged calls took the first token off once: now each sequence's time after its first token over the
    tokens it emitted then, summed over sequences. acceptance_by_position lists only positions something was
    drafted at (a 0.0 after them read as drafts always rejected there)."""
    target, draft = tiny
    batch = torch.tensor([[1, 1, 1, 0, 5, 9, 5, 9], [0, 4, 8, 12, 4, 8, 12, 4], [1, 1, 0, 7, 7, 3, 7, 7]])
    mask = (torch.arange(8)[None, :] >= torch.tensor([[3], [0], [2]])).long()
    run = dict(custom_generate=hf_spec.generate, return_dict_in_generate=True, do_sample=False)
    stats = target.generate(batch, attention_mask=mask, max_new_tokens=20, drafter=hf_spec.DraftModelDrafter(draft, 3),
                            **run).stats
    rows = list(stats.per_row.values())
    assert len(rows) == 3 and len({r.num_emitted_tokens for r in rows}) > 1  # rows that end at different steps
    for r in rows:
        assert r.tpot_s == pytest.approx((r.total_s - r.ttft_s) / (r.num_emitted_tokens - 1))
    assert stats.tpot_s == pytest.approx(sum(r.total_s - r.ttft_s for r in rows)
                                         / sum(r.num_emitted_tokens - 1 for r in rows))
    assert min(r.tpot_s for r in rows) <= stats.tpot_s <= max(r.tpot_s for r in rows)
    calls = [target.generate(PROMPT, max_new_tokens=n, drafter=hf_spec.NgramDrafter(3), **run).stats for n in (4, 9)]
    merged = hf_spec.SpecStats().merge(calls[0]).merge(calls[1])
    assert merged.tpot_s == pytest.approx(sum(c.total_s - c.ttft_s for c in calls)
                                          / sum(c.num_emitted_tokens - 1 for c in calls))
    tree = target.generate(PROMPT, max_new_tokens=20, drafter=hf_spec.DraftModelDrafter(draft, 4), num_tree_nodes=3,
                           **run).stats
    assert len(tree.acceptance_by_position) == max(i + 1 for i, d in enumerate(tree.drafted_per_position) if d)


def test_events_and_streamer_see_every_token(tiny):
    target, draft = tiny

    class Collect(BaseStreamer):
        def __init__(self):
            self.chunks, self.ended = [], False

        def put(self, value):
            self.chunks.append(value.reshape(-1).tolist())

        def end(self):
            self.ended = True

    events, streamer = [], Collect()
    out = target.generate(PROMPT, max_new_tokens=20, do_sample=False, custom_generate=hf_spec.generate, return_dict_in_generate=True,
                          drafter=hf_spec.DraftModelDrafter(draft, 3), spec_streamer=streamer,
                          event_listeners=[events.append])
    new = out.sequences[0, PROMPT.shape[1]:].tolist()
    assert streamer.chunks[0] == PROMPT[0].tolist() and streamer.ended
    assert sum(streamer.chunks[1:], []) == new
    assert sum((e.emitted[0] for e in events), []) == new
    assert events[0].step == 0 and events[-1].finished == [True]
    for e in events[1:]:
        assert e.emitted[0][: e.num_accepted[0]] == e.drafted[0][: e.num_accepted[0]]


def test_enable_drafters_entry_point_gives_the_loop_result(tiny):
    target, draft = tiny
    ref = target.generate(PROMPT, max_new_tokens=16, do_sample=False, custom_generate=hf_spec.generate, return_dict_in_generate=True,
                          drafter=hf_spec.NgramDrafter(3))
    hf_spec.enable_drafters(target)
    hf_spec.enable_drafters(target)  # idempotent
    seq = target.generate(PROMPT, max_new_tokens=16, do_sample=False, assistant_model=hf_spec.NgramDrafter(3))
    assert torch.equal(seq, ref.sequences)
    out = target.generate(PROMPT, max_new_tokens=16, assistant_model=hf_spec.NgramDrafter(3), return_dict_in_generate=True)
    assert out.stats.to_dict()["num_emitted_tokens"] == ref.stats.num_emitted_tokens
    # without an hf-spec drafter the original generate runs, untouched
    plain = target.generate(PROMPT, max_new_tokens=16, do_sample=False)
    assert torch.is_tensor(plain)
    assert torch.equal(plain, type(target).generate(target, PROMPT, max_new_tokens=16, do_sample=False))


def test_enable_drafters_survives_deepcopy_and_pickle():
    """Before, the wrapper closed over the original model: a deep copy ran the original's weights, silently, and
    the model no longer pickled."""
    import copy
    import pickle

    target = tiny_llama(seed=5)
    hf_spec.enable_drafters(target)
    clone = copy.deepcopy(target)
    with torch.no_grad():
        for p in clone.parameters():
            p.add_(0.5 * torch.randn_like(p))
    ref = type(clone).generate(clone, PROMPT, max_new_tokens=12, do_sample=False)
    assert not torch.equal(ref, type(target).generate(target, PROMPT, max_new_tokens=12, do_sample=False))
    assert torch.equal(clone.generate(PROMPT, max_new_tokens=12, do_sample=False,
                                      assistant_model=hf_spec.NgramDrafter(3)), ref)
    back = pickle.loads(pickle.dumps(target))
    assert torch.equal(back.generate(PROMPT, max_new_tokens=12, do_sample=False),
                       target.generate(PROMPT, max_new_tokens=12, do_sample=False))


def test_crop_cache_to_uses_transformers_crop_semantics(tiny):
    """Fails loudly if transformers changes DynamicCache.crop (negative count of tokens in 5.x)."""
    from transformers import DynamicCache

    target, _ = tiny
    cache = DynamicCache(config=target.config)
    target(input_ids=PROMPT, **{cache_kwarg(target): cache})
    crop_cache_to(cache, 4)
    assert cache.get_seq_length() == 4
    crop_cache_to(cache, 9)
    assert cache.get_seq_length() == 4


# ---- bad input ----------------------------------------------------------------------------------

def _gen(target, drafter=None, **kw):
    kw.setdefault("max_new_tokens", 4)
    inputs = kw.pop("input_ids", PROMPT)
    return target.generate(inputs, custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=drafter, **kw)


def test_k_below_one_is_refused(tiny):
    target, draft = tiny
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="num_speculative_tokens"):
            hf_spec.NgramDrafter(bad)
        with pytest.raises(ValueError, match="num_speculative_tokens"):
            hf_spec.DraftModelDrafter(draft, bad)
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        _gen(target, hf_spec.NgramDrafter(3), num_speculative_tokens=0)


def test_vocabulary_mismatch_names_both(tiny):
    target, _ = tiny
    other = tiny_llama(vocab_size=40, seed=3)
    with pytest.raises(hf_spec.VocabularyMismatchError, match="32.*40"):
        _gen(target, hf_spec.DraftModelDrafter(other, 3))


def test_bad_batches_refused(tiny):
    target, _ = tiny
    ids = PROMPT.repeat(2, 1)
    right = torch.ones_like(ids)
    right[1, -2:] = 0
    with pytest.raises(ValueError, match="the batch is right-padded.*padding_side = 'left'"):
        _gen(target, hf_spec.NgramDrafter(2), input_ids=ids, attention_mask=right)
    with pytest.raises(ValueError, match="the prompt is right-padded .*drop the trailing padding"):  # one row: no batch
        _gen(target, hf_spec.NgramDrafter(2), input_ids=ids[1:], attention_mask=right[1:])
    empty_row = torch.ones_like(ids)
    empty_row[1] = 0
    with pytest.raises(ValueError, match="empty prompt"):
        _gen(target, hf_spec.NgramDrafter(2), input_ids=ids, attention_mask=empty_row)
    with pytest.raises(ValueError, match="streamer"):
        _gen(target, hf_spec.NgramDrafter(2), input_ids=ids, attention_mask=torch.ones_like(ids),
             spec_streamer=object())


def test_beam_and_other_modes_refused(tiny):
    target, draft = tiny
    with pytest.raises(ValueError, match="beam search"):
        _gen(target, hf_spec.NgramDrafter(2), num_beams=2)
    # num_return_sequences runs through generate, which repeats the prompts; called directly, the loop says so
    from transformers import GenerationConfig, StoppingCriteriaList
    from transformers.generation import MaxLengthCriteria

    config = GenerationConfig(do_sample=True, num_return_sequences=2, max_length=PROMPT.shape[1] + 4)
    with pytest.raises(ValueError, match="repeat_interleave"):
        hf_spec.speculative_decode(target, PROMPT, hf_spec.NgramDrafter(2), generation_config=config,
                                   stopping_criteria=StoppingCriteriaList([MaxLengthCriteria(config.max_length)]))
    with pytest.raises(TypeError, match="Drafter"):
        _gen(target, draft)  # a model is not a drafter: wrap it in DraftModelDrafter
    # a cache that cannot roll back is refused, naming what the call passed (a break-it tester's "sliding_window"
    # was told about a StaticCache it never named)
    for implementation in ("static", "offloaded_static", "sliding_window"):
        with pytest.raises(ValueError, match=f"unsupported cache: cache_implementation='{implementation}' .*drop "
                                             "cache_implementation$"):
            _gen(target, hf_spec.NgramDrafter(2), cache_implementation=implementation)
    from transformers import DynamicCache, StaticCache

    with pytest.raises(ValueError, match=r"unsupported cache: a StaticCache passed as the cache .*pass a "
                                         r"DynamicCache or none$"):
        _gen(target, hf_spec.NgramDrafter(2), **{cache_kwarg(target): StaticCache(config=target.config, max_cache_len=64)})
    # the torch.compile recipe sets it on the model: said so, with the call's way out, which then works
    compiled_recipe = copy.deepcopy(target)
    compiled_recipe.generation_config.cache_implementation = "static"
    with pytest.raises(ValueError, match=r"set in the model's generation_config .*pass cache_implementation=None to "
                                         "this call"):
        _gen(compiled_recipe, hf_spec.NgramDrafter(2))
    assert _gen(compiled_recipe, hf_spec.NgramDrafter(2), cache_implementation=None).sequences.shape[1] > PROMPT.shape[1]

    filled = DynamicCache(config=target.config)
    target(input_ids=PROMPT[:, :3], **{cache_kwarg(target): filled})
    with pytest.raises(ValueError, match="holds 3 tokens and input_ids 2: .*the whole sequence"):  # not its prefix
        _gen(target, hf_spec.NgramDrafter(2), input_ids=PROMPT[:, :2], **{cache_kwarg(target): filled})
    padded = torch.ones_like(PROMPT)
    padded[0, 0] = 0
    with pytest.raises(ValueError, match="takes a prompt without padding"):
        _gen(target, hf_spec.NgramDrafter(2), attention_mask=padded, **{cache_kwarg(target): filled})
    with pytest.raises(ValueError, match="filled cache is supported for one sequence"):
        _gen(target, hf_spec.NgramDrafter(2), input_ids=PROMPT.repeat(2, 1), **{cache_kwarg(target): filled})


def test_empty_prompt_refused(tiny):
    target, _ = tiny
    with pytest.raises(ValueError, match="empty prompt"):
        hf_spec.speculative_decode(target, PROMPT[:, :0], hf_spec.NgramDrafter(2),
                                   generation_config=GenerationConfig(max_length=5))
    from hf_spec.prompts import chat_inputs
    with pytest.raises(ValueError, match="empty prompt"):
        chat_inputs(None, "   ")
