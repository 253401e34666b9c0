"""A real sliding-window target end to end: Gemma-3-270M (base, float32), prompts long enough that prompt and
output pass its 512-token sliding window, greedy speculative output token-identical to plain ``generate`` with
an n-gram drafter and with a self-draft (the target's own weights, two layers skipped), alone and in a
left-padded batch of two.

Gemma 3 attends within a 512-token window on 15 of its 18 layers and over everything on the other 3; plain
``generate`` keeps a sliding-window cache, hf-spec a cache of every position with the window counted in each
row's positions (rejected draft tokens leave holes that must not shrink it). The prompts are Spec-Bench
articles cut to a fixed number of tokens: 530 (past the window from the prefill on) and, in the batch, 500
beside 530 (that row crosses the window while drafts are verified and rolled back)."""

import pytest
import torch

import hf_spec
import hf_spec.ragged
from hf_spec.prompts import load_questions

from .conftest import first_divergence, layer_skip_copy, top2_gap

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def no_window_slack(monkeypatch):
    """The window layers of hf-spec's cache drop every slot no query reads again (no slack past the window,
    hf_spec.ragged.WINDOW_SLACK), so these calls, a few dozen tokens past the window, roll back across dropped slots."""
    monkeypatch.setattr(hf_spec.ragged, "WINDOW_SLACK", 0)
NEW = 24
SKIP = (12, 13)  # two sliding layers: a self-draft that is accepted about half of the time on these prompts


@pytest.fixture(scope="module")
def articles(gemma3):
    """Token ids (``<bos>`` first) of two Spec-Bench summarization prompts, each longer than 600 tokens."""
    _, tok = gemma3
    out = []
    for q in load_questions(categories=["summarization"]):
        ids = tok(q.text, return_tensors="pt")["input_ids"]
        if ids.shape[1] >= 600:
            out.append(ids)
        if len(out) == 2:
            return out
    raise AssertionError("fewer than two Spec-Bench summarization prompts of 600 tokens or more")


@pytest.fixture(scope="module")
def self_draft(gemma3):
    model, _ = gemma3
    return layer_skip_copy(model, [i for i in range(model.config.num_hidden_layers) if i not in SKIP])


def drafters(draft):
    return {"ngram": hf_spec.NgramDrafter(3), "self-draft": hf_spec.DraftModelDrafter(draft, 3)}


def assert_identical(model, spec, base, mask, label):
    """Every row of ``spec`` equals ``base``; otherwise name the first differing new token and its top-2 gap."""
    width = mask.shape[1]
    for b in range(base.shape[0]):
        j = first_divergence(spec[b:b + 1], base[b:b + 1], width)
        if j is not None:
            real = base[b:b + 1, :j][:, mask[b].bool().tolist() + [True] * (j - width)]
            gap = top2_gap(model, real) if j < base.shape[1] else float("nan")
            pytest.fail(f"{label}: row {b} differs from plain generate at new token {j - width} "
                        f"(top-2 logit gap there {gap:.2e})")


def test_gemma3_is_a_sliding_window_model(gemma3):
    model, _ = gemma3
    cfg = model.config
    assert cfg.model_type == "gemma3_text" and cfg.sliding_window == 512
    assert cfg.layer_types.count("sliding_attention") == 15 and cfg.layer_types.count("full_attention") == 3
    assert cfg.rope_parameters["sliding_attention"]["rope_theta"] == 10_000.0
    assert cfg.rope_parameters["full_attention"]["rope_theta"] == 1_000_000.0


def test_past_the_window_greedy_identical(gemma3, articles, self_draft):
    model, _ = gemma3
    ids = articles[0][:, :530]
    mask = torch.ones_like(ids)
    assert ids.shape[1] + NEW > model.config.sliding_window
    base = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
    assert base.shape[1] == ids.shape[1] + NEW
    for name, drafter in drafters(self_draft).items():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False,
                             custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=drafter)
        assert_identical(model, out.sequences, base, mask, name)
        if name == "self-draft":  # drafts both accepted and rejected (rolled back) past the window
            assert 0 < out.stats.num_accepted_tokens < out.stats.num_draft_tokens


def test_left_padded_batch_past_the_window_greedy_identical(gemma3, articles, self_draft):
    model, tok = gemma3
    rows = [articles[1][0, :530], articles[0][0, :500]]
    width = max(len(r) for r in rows)
    ids = torch.stack([torch.cat([torch.full((width - len(r),), tok.pad_token_id), r]) for r in rows])
    mask = torch.stack([torch.cat([torch.zeros(width - len(r), dtype=torch.long), torch.ones(len(r), dtype=torch.long)])
                        for r in rows])
    assert len(rows[1]) < model.config.sliding_window < len(rows[1]) + NEW  # row 1 crosses it while speculating
    base = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
    for name, drafter in drafters(self_draft).items():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False,
                             custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=drafter)
        assert_identical(model, out.sequences, base, mask, f"batch {name}")


def test_a_second_turn_past_the_window_continues_from_the_first_turns_cache(gemma3, articles, self_draft):
    """Multi-turn prompt caching past the window: the first turn (530 prompt tokens) leaves its tokens in the cache
    passed, as generate does (window layers holding their last 511 positions); the second turn continues from it on
    hf-spec with the draft model's cache carried over, the same tokens as plain generate continuing from a copy."""
    import copy

    from transformers import DynamicCache

    model, _ = gemma3
    ids = articles[0][:, :530]
    cache = DynamicCache(config=model.config)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False, cache=cache,
                         custom_generate=hf_spec.generate, return_dict_in_generate=True,
                         drafter=hf_spec.DraftModelDrafter(self_draft, 3))
    assert out.cache is cache and cache.get_seq_length() == out.sequences.shape[1] - 1
    assert cache.layers[0].keys.shape[-2] == model.config.sliding_window - 1  # a window layer, as generate leaves it
    ids2 = torch.cat([out.sequences, articles[1][:, 1:20]], 1)  # the next turn: more text after the first
    mask = torch.ones_like(ids2)
    base = model.generate(ids2, attention_mask=mask, max_new_tokens=NEW, do_sample=False, cache=copy.deepcopy(cache))
    spec = model.generate(ids2, attention_mask=mask, max_new_tokens=NEW, do_sample=False, cache=cache,
                          custom_generate=hf_spec.generate, return_dict_in_generate=True,
                          drafter=hf_spec.DraftModelDrafter(self_draft, 3))
    assert_identical(model, spec.sequences, base, mask, "second turn")
    assert spec.cache is cache and spec.stats.num_accepted_tokens > 0
