"""Targets (and drafts) with sliding-window attention (Mistral here; Gemma 2/3, Phi-3 and Qwen2 with
``use_sliding_window`` use the same cache layer; the conformance matrix and the real Gemma-3 test cover those):
exact within and past the window, unbatched and in a left-padded batch whose rejected drafts leave holes
(before, the first rollback past the window crashed inside transformers: "crop was called, but the current
layer does not track past states"; counting the window in cache slots, holes would shrink it)."""

import copy

import pytest
import torch
from transformers import DynamicCache, MistralConfig, MistralForCausalLM

import hf_spec
import hf_spec.ragged
from hf_spec.ragged import sliding_windows

from . import conformance as C

from .test_medusa import random_heads

PROMPT = torch.tensor([[0, 5, 9, 5, 9, 5, 3, 7, 11, 5, 9]])
DEFAULT_SLACK = hf_spec.ragged.WINDOW_SLACK  # (the fixture at the end sets it to 0 for every test here)


def tiny_mistral(window: int, seed: int = 0, noise: float = 0.0):
    torch.manual_seed(seed)
    model = MistralForCausalLM(MistralConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2, sliding_window=window,
                                             bos_token_id=0, eos_token_id=None, pad_token_id=1)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(noise * torch.randn_like(p))
    return model


def drafters(draft, target, k):
    """(drafter, num_tree_nodes) pairs: chains of each kind, and at k > 1 the draft model's and Medusa's trees (the
    target's tree mask counts the window in positions too)."""
    heads = random_heads(n=3, seed=1).bind(target)
    chains = [(hf_spec.NgramDrafter(k), 0), (hf_spec.DraftModelDrafter(draft, k), 0),
              (hf_spec.MedusaDrafter(heads, min(k, 3)), 0)]
    trees = [(hf_spec.DraftModelDrafter(draft, k), 7), (hf_spec.MedusaDrafter(heads, min(k, 3)), 7)] if k > 1 else []
    return chains + trees


BATCH = torch.tensor([[1, 1, 1, 1, 0, 5, 9, 5, 9, 5, 3], [0, 7, 3, 7, 3, 7, 3, 7, 3, 7, 3], [1, 1, 1, 1, 1, 1, 1, 1, 0, 4, 4]])
BATCH_MASK = (torch.arange(BATCH.shape[1])[None] >= (BATCH == 1).sum(1, keepdim=True)).long()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("window", [64, 8])  # 64: the whole call fits; 8: prompt + 30 new tokens pass it
def test_exact_within_and_past_the_window_single_and_batched(window, attn):
    target = tiny_mistral(window)
    draft = tiny_mistral(window, noise=0.02)  # a draft with a window too (its own rolled-back cache)
    for m in (target, draft):
        m.set_attn_implementation(attn)
    for inputs in (dict(input_ids=PROMPT), dict(input_ids=BATCH, attention_mask=BATCH_MASK)):
        ref = target.generate(**inputs, max_new_tokens=30, do_sample=False)
        for k in (1, 3):
            for drafter, nodes in drafters(draft, target, k):
                steps = []
                out = target.generate(**inputs, max_new_tokens=30, do_sample=False, custom_generate=hf_spec.generate, return_dict_in_generate=True,
                                      drafter=drafter, num_tree_nodes=nodes, event_listeners=[steps.append])
                assert out.sequences.tolist() == ref.tolist(), (drafter.method, k, nodes)
                if window == 8 and drafter.method != "medusa":  # rejections happened past the window
                    assert any(int(n) < k for e in steps[1:] for n in e.num_accepted), drafter.method


def test_window_counts_positions_not_cache_slots():
    """The mask's window is counted in each row's positions: a batch row whose cache has holes (rejected drafts)
    still sees exactly its last W tokens, as the row decoded alone does."""
    from hf_spec.ragged import RaggedCache
    target = tiny_mistral(4)
    ragged = RaggedCache(target.config, 2, "cpu")
    block = torch.tensor([[0, 5, 9, 3, 7, 2], [0, 5, 9, 3, 7, 2]])
    ragged.forward(target, block[:, :2])  # a prompt, then a verify block
    ragged.forward(target, block[:, 2:], logits_to_keep=4)
    ragged.truncate(torch.tensor([4, 6]))  # row 0: slots 4, 5 are holes; row 1 keeps all six
    ragged.valid = torch.cat([ragged.valid, torch.tensor([[True], [True]])], dim=1)
    m = ragged._masks(target, ragged.lengths[:, None])[:, 0, 0]  # [B, T]: what the new query (slot 6) sees
    assert m[0].tolist() == [False, True, True, True, False, False, True]  # positions 1..4 of row 0 (window 4)
    assert m[1].tolist() == [False, False, False, True, True, True, True]  # positions 3..6 of row 1


def test_other_attention_implementations_are_refused_before_any_work():
    target = tiny_mistral(8)
    target.config._attn_implementation = "flex_attention"  # as loaded with attn_implementation=...
    with pytest.raises(ValueError, match="attn_implementation='sdpa'"):
        target.generate(PROMPT, max_new_tokens=4, do_sample=False, custom_generate=hf_spec.generate, return_dict_in_generate=True,
                        drafter=hf_spec.NgramDrafter(3))


def test_a_callers_empty_cache_keeps_the_window_masks_and_the_refusals():
    """An empty ``DynamicCache()`` passed in (transformers' docs do) has no layers to read the window from: the
    layer kinds come from the config, so the batch stays exact past the window and chunked attention refused."""
    from transformers import DynamicCache

    from hf_spec.ragged import cache_kwarg
    from . import conformance as C

    target = tiny_mistral(4, noise=0.5)
    kwarg = cache_kwarg(target)  # the keyword this transformers' generate takes
    ref = target.generate(input_ids=BATCH, attention_mask=BATCH_MASK, max_new_tokens=20, do_sample=False)
    out = target.generate(input_ids=BATCH, attention_mask=BATCH_MASK, max_new_tokens=20, do_sample=False,
                          custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=hf_spec.NgramDrafter(3), **{kwarg: DynamicCache()})
    assert out.sequences.tolist() == ref.tolist()
    filled = DynamicCache(config=target.config)  # a cache of layers hf-spec cannot take over: refused, saying why
    target(input_ids=PROMPT[:, :3], **{kwarg: filled})
    filled.layers[0].__class__ = type("MyWindowLayer", (type(filled.layers[0]),), {})
    with pytest.raises(ValueError, match="layers of kind MyWindowLayer.*plain model.generate"):
        target.generate(PROMPT, max_new_tokens=4, custom_generate=hf_spec.generate, drafter=hf_spec.NgramDrafter(3),
                        **{kwarg: filled})
    chunked = C.build(next(a for a in C.ARCHITECTURES if a.refusal == "chunked_attention"))
    with pytest.raises(ValueError, match="chunked_attention"):
        chunked.generate(PROMPT, max_new_tokens=4, do_sample=False, custom_generate=hf_spec.generate, return_dict_in_generate=True,
                         drafter=hf_spec.NgramDrafter(3), **{kwarg: DynamicCache()})


def test_linear_attention_with_a_window_is_not_taken_for_a_sliding_window():
    """transformers keeps linear attention + a local window in a subclass of the sliding-window layer: it has
    recurrent state hf-spec cannot roll back, so it is refused like linear attention."""
    from transformers import DynamicCache

    from hf_spec.ragged import check_cache_layers
    inkling = pytest.importorskip("transformers.models.inkling.configuration_inkling")
    cfg = inkling.InklingTextConfig(num_hidden_layers=2, local_layer_ids=[0, 1])
    with pytest.raises(ValueError, match="layers of kind"):
        check_cache_layers(cfg, DynamicCache(config=cfg))


SLIDING = [a for a in C.ARCHITECTURES if not a.refused("single", "draft model") and
           sliding_windows(DynamicCache(config=a.config()))]


@pytest.mark.parametrize("arch", SLIDING, ids=lambda a: a.name)
def test_a_sliding_window_conversation_continues_from_its_cache_on_every_architecture(arch):
    """Multi-turn prompt caching on every sliding-window architecture of the conformance matrix, past the window:
    hf-spec hands the caller's cache back as generate leaves it (window layers holding their last W - 1 positions;
    it returned ``None`` and refused a filled cache before), plain generate continues exactly from it, and hf-spec
    continues exactly from its own cache and from plain generate's. Dory adds cache layers of its own on its first
    forward, so a first call leaves no cache there; it continues from plain generate's."""
    target, draft = C.build(arch), C.build(arch, noise=C.DRAFT_NOISE)
    ids = torch.tensor([C.PROMPT])
    run = dict(max_new_tokens=12, do_sample=False)

    def spec(ids, cache):
        return target.generate(ids, attention_mask=torch.ones_like(ids), cache=cache, custom_generate=hf_spec.generate,
                               return_dict_in_generate=True, drafter=C.make_drafter("draft model", target, draft, 3), **run)

    plain_cache = DynamicCache(config=target.config)
    plain = target.generate(ids, attention_mask=torch.ones_like(ids), cache=plain_cache, **run)
    ids2 = torch.cat([plain, torch.tensor([[4, 6, 8]])], 1)
    assert ids2.shape[1] > C.WINDOW
    fresh = target.generate(ids2, attention_mask=torch.ones_like(ids2), **run)
    cache = DynamicCache(config=target.config)
    out = spec(ids, cache)
    assert torch.equal(out.sequences, plain)
    if arch.name.startswith("Dory"):
        assert out.cache is None
    else:
        assert out.cache is cache and out.stats.num_accepted_tokens > 0
        for mine, theirs in zip(cache.layers, plain_cache.layers):
            assert type(mine) is type(theirs) and getattr(mine, "cumulative_length", None) == \
                getattr(theirs, "cumulative_length", None)
            if theirs.keys is not None:  # float noise of other block shapes only (a wrong slot differs by O(1))
                torch.testing.assert_close(mine.keys, theirs.keys, rtol=1e-3, atol=1e-4)
        assert torch.equal(target.generate(ids2, attention_mask=torch.ones_like(ids2), cache=copy.deepcopy(cache),
                                           **run), fresh)
        again = spec(ids2, cache)
        assert torch.equal(again.sequences, fresh) and again.cache is cache
        assert cache.get_seq_length() == fresh.shape[1] - 1
    from_plain = spec(ids2, plain_cache)
    assert torch.equal(from_plain.sequences, fresh) and from_plain.cache is plain_cache


@pytest.fixture(autouse=True)
def no_slack(monkeypatch):
    """Window layers drop every slot no query reads again (no slack past the window): the short tiny-model calls here
    then roll back, branch into trees and hand back caches across dropped slots."""
    monkeypatch.setattr(hf_spec.ragged, "WINDOW_SLACK", 0)


@pytest.mark.parametrize("arch", [a for a in SLIDING if a.name in ("Mistral (sliding window)", "Gemma 3")],
                         ids=lambda a: a.name)
def test_window_layers_hold_their_window_and_slack_not_the_whole_sequence(arch, monkeypatch):
    """hf-spec's own cache of a sliding-window target: after the window (and the default slack) has passed, each
    window layer holds fewer than W + slack + twice the largest block (4) of each row's positions (in a batch, the
    rows' holes beside them), as transformers' window layer holds W - 1, while full layers (Gemma 3's every sixth) hold
    every slot; the output stays plain decoding's, in a batch too."""
    monkeypatch.setattr(hf_spec.ragged, "WINDOW_SLACK", DEFAULT_SLACK)
    target, draft = C.build(arch), C.build(arch, noise=C.DRAFT_NOISE)
    kinds = [bool(getattr(layer, "sliding_window", None)) for layer in DynamicCache(config=target.config).layers]
    held = []  # after each target forward: (slots, [slots each layer holds])

    def spy(forward):
        def wrapped(self, model, *args, **kwargs):
            out = forward(self, model, *args, **kwargs)
            if model is target:
                held.append((self.valid.shape[1], [layer.keys.shape[-2] for layer in self.cache.layers],
                             int(self.valid[:, self.dropped:].sum(dim=1).max())))
            return out
        return wrapped

    monkeypatch.setattr(hf_spec.ragged.RaggedCache, "forward", spy(hf_spec.ragged.RaggedCache.forward))
    new = 90  # the prompt (11) + 90 tokens pass W + slack + block (8 + 64 + 4)
    for inputs in (dict(input_ids=PROMPT), dict(input_ids=BATCH[:2], attention_mask=BATCH_MASK[:2])):
        held.clear()
        ref = target.generate(**inputs, max_new_tokens=new, do_sample=False, min_new_tokens=new)
        out = target.generate(**inputs, max_new_tokens=new, do_sample=False, min_new_tokens=new,
                              custom_generate=hf_spec.generate, drafter=hf_spec.DraftModelDrafter(draft, 3))
        assert torch.equal(out, ref)
        slots, layers, positions = held[-1]
        assert slots > C.WINDOW + DEFAULT_SLACK + 2 * 4 and positions < C.WINDOW + DEFAULT_SLACK + 2 * 4
        for sliding, n in zip(kinds, layers):
            assert n < slots - C.WINDOW if sliding else n == slots, (slots, layers)
        if inputs["input_ids"].shape[0] == 1:  # one row: no holes, its slots are its positions
            assert min(layers) == positions
    # a second turn continuing from the caller's cache with a long new message (the prompt's rest is no verify block:
    # it once raised the slack by its length), the draft's cache carried over: the same bound for both
    from hf_spec.loop import CARRIED
    cache = DynamicCache(config=target.config)
    drafter = hf_spec.DraftModelDrafter(draft, 3)
    first = target.generate(PROMPT, max_new_tokens=20, do_sample=False, cache=cache, custom_generate=hf_spec.generate,
                            drafter=drafter)
    ids = torch.cat([first, torch.randint(2, 30, (1, 150), generator=torch.Generator().manual_seed(0))], 1)
    held.clear()
    out = target.generate(ids, max_new_tokens=20, do_sample=False, cache=cache, custom_generate=hf_spec.generate,
                          drafter=drafter)
    assert torch.equal(out, target.generate(ids, max_new_tokens=20, do_sample=False))
    carried = getattr(cache, CARRIED).ragged
    for ragged_positions in (held[-1][2], int(carried.valid[:, carried.dropped:].sum())):
        assert ragged_positions < C.WINDOW + DEFAULT_SLACK + 2 * 4


def test_a_carried_draft_cache_that_cannot_roll_back_past_its_dropped_slots_is_rebuilt():
    """A sliding-window draft's cache dropped the slots past its window: a later sequence that shares only an
    earlier prefix with it (a caller's conversation changed within the last window) cannot reuse it, so the draft
    is fed the whole sequence again, and drafts what a fresh drafter drafts."""
    from transformers import GenerationConfig

    draft = tiny_mistral(8, noise=0.02)
    config = GenerationConfig(do_sample=False, max_length=200)
    drafter = hf_spec.DraftModelDrafter(draft, 3).start(draft, PROMPT, config)
    fed = []
    hook = draft.register_forward_pre_hook(lambda m, a, kw: fed.append(kw["input_ids"].shape[1]), with_kwargs=True)
    try:
        seq = torch.arange(40) % 29 + 2
        drafter.draft([seq], 3)
        drafter.draft([torch.cat([seq, torch.tensor([5])])], 3)  # the truncate here drops slots past the window
        assert drafter._ragged.dropped > 0
        with pytest.raises(ValueError, match="dropped the keys of the first"):
            drafter._ragged.truncate(torch.tensor([5]))
        changed = torch.cat([seq[:30], torch.tensor([7, 7, 7])])  # shares 30 tokens: within the last window
        fed.clear()
        mine = drafter.draft([changed], 3)
        assert fed[0] == len(changed)  # refed from the start
        fresh = hf_spec.DraftModelDrafter(draft, 3).start(draft, PROMPT, config).draft([changed], 3)
        assert torch.equal(mine[0], fresh[0])
        fed.clear()
        drafter.draft([torch.cat([changed, torch.tensor([3])])], 3)  # within the call: rolled back, not refed
        assert fed[0] == 1  # the new token alone: a short catch-up
    finally:
        hook.remove()
