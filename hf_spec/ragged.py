"""Per-row KV-cache bookkeeping for batched speculative decoding.

In a batch, each row accepts its own number of drafted tokens per step, so rows grow at different rates.
:class:`RaggedCache` keeps one rectangular ``transformers`` ``DynamicCache`` (``[B, heads, T, head_dim]``)
and a boolean ``valid`` mask ``[B, T]`` of the slots that hold a token of the row's sequence. A rejected
token's slot becomes a *hole*: it stays in the tensor but the 2D attention mask hides it, and position ids
count valid slots only, so every row's attention and rotary positions are exactly those of the row alone
(masked scores get exactly zero weight). Slots that are holes in every row at the tail are cropped, so a
batch of one never keeps a hole and the cache stays as long as the sequence.

This is the "per-row lengths" design (as in BASS, Qian et al. 2024, "BASS: Batched Attention-optimized
Speculative Sampling"), with the masking and position handling of ``transformers`` itself: the model gets
``attention_mask [B, T + n]`` and ``position_ids [B, n]``; ``transformers`` builds the causal mask.

Two exceptions, both for grouped-query models on the CPU, where the measured choice of
:mod:`hf_spec.kernels` picks them on this machine (docs/benchmarks.md):

- a one-position block (a plain decode step of the target, a draft model's drafting step) gets a 4D mask built
  here (:func:`~hf_spec.kernels.one_query_mask_pays`): without a mask, transformers' ``sdpa`` attention runs a
  grouped-query query through a CPU kernel that took 4-11x as long in bfloat16;
- a block of 2..64 positions after cached ones (a verify forward, a draft model's catch-up)
  gets a 4D mask built here and attends through :func:`~hf_spec.kernels.packed_sdpa_attention`
  (:func:`~hf_spec.kernels.packed_attention_pays`), which reads each key/value head once instead of copying it per
  query head as transformers' ``repeat_kv`` does: 2-4x or more less attention time for 2-5 positions.
"""

from __future__ import annotations

import contextlib
import functools
import inspect

import torch
from transformers import DynamicCache
from transformers.cache_utils import DummyLayer, DynamicLayer, DynamicSlidingWindowLayer
from transformers.generation.utils import ALL_CACHE_NAMES

from .kernels import measure_attention_choices, one_query_mask_pays, packed_attention, packed_attention_pays

__all__ = ["RaggedCache", "can_hand_back", "crop_cache_to", "layer_kinds", "check_cache_layers", "cache_kwarg",
           "check_block_forward", "check_tree_model", "positions_from_slots", "slot_window", "check_key_selection"]

#: The cache keyword of this transformers' models: ``cache`` in newer 5.x (which still accept ``past_key_values``
#: with a FutureWarning), ``past_key_values`` in older ones (5.17 silently ignores ``cache=``).
CACHE_KWARG = "cache" if "cache" in ALL_CACHE_NAMES else "past_key_values"


def cache_kwarg(model) -> str:
    """The keyword under which a model's forward (and ``generate``) takes its KV cache: ``"cache"`` or
    ``"past_key_values"`` (:data:`CACHE_KWARG`, unless the forward's signature names only the other one).
    ``model`` is a model or its class; read once per class (the loop asks at every forward)."""
    return _cache_kwarg_of(model if isinstance(model, type) else type(model))


@functools.lru_cache(maxsize=None)
def _cache_kwarg_of(cls) -> str:
    try:
        params = inspect.signature(cls.forward).parameters
    except (TypeError, ValueError):
        return CACHE_KWARG
    for name in (CACHE_KWARG, "cache", "past_key_values"):
        if name in params:
            return name
    return CACHE_KWARG


def layer_kinds(config, cache) -> list[str]:
    """What each layer of a fresh ``transformers`` cache for ``config`` attends to: ``"full_attention"`` (a
    ``DynamicLayer``), ``"sliding_attention"`` or ``"chunked_attention"`` (both kept by a
    ``DynamicSlidingWindowLayer``; Llama 4's chunks are told apart by ``layer_types`` / ``attention_chunk_size``),
    else the layer class's name (linear attention and other recurrent states, shared or indexed layers)."""
    text = config.get_text_config()
    types = getattr(text, "layer_types", None)
    kinds = []
    for i, layer in enumerate(cache.layers):
        if type(layer) is DynamicLayer:
            kinds.append("full_attention")
        elif type(layer) is DynamicSlidingWindowLayer:  # not its subclasses (linear attention + window)
            chunked = types[i] == "chunked_attention" if types and i < len(types) else \
                getattr(text, "attention_chunk_size", None) is not None
            kinds.append("chunked_attention" if chunked else "sliding_attention")
        else:
            kinds.append(type(layer).__name__)
    return kinds


#: what a cache layer class that :func:`check_cache_layers` refuses holds, in words
_LAYER_WORDS = {"DynamicIndexedLayer": "indexed key selection",
                "chunked_attention": "attention within fixed chunks"}

#: the layer kinds :class:`RaggedCache` rolls back exactly: full and sliding-window attention, and transformers'
#: ``DummyLayer``, which holds nothing (a layer without attention, or one that attends over the keys and values an
#: earlier layer of its kind computed, as Gemma 3n's and Gemma 4's last layers do: they see what that layer's cache
#: returns, rolled back with it, under the mask hf-spec builds for their kind; exact in the conformance matrix)
SUPPORTED_LAYER_KINDS = frozenset({"full_attention", "sliding_attention", "DummyLayer"})


def check_cache_layers(config, cache, role: str = "target") -> None:
    """Refuse a model whose cache has layers other than :data:`SUPPORTED_LAYER_KINDS` (:func:`layer_kinds`).

    Args:
        config: the model's config.
        cache: a fresh ``DynamicCache(config=config)`` (or the caller's).
        role: ``"target"`` (the advice: plain ``generate``) or ``"draft"`` (the advice: another drafter).

    Raises:
        ValueError: naming the layer kinds (with what they hold), saying what to do instead.
    """
    unsupported = sorted(set(layer_kinds(config, cache)) - SUPPORTED_LAYER_KINDS)
    if unsupported:
        named = ", ".join(f"{kind} ({_LAYER_WORDS[kind]})" if kind in _LAYER_WORDS else
                          f"{kind} (recurrent state)" if "Linear" in kind else kind for kind in unsupported)
        advice = ("decode this target with plain model.generate" if role == "target" else
                  "draft with another model of the target's tokenizer, or with a model-free drafter "
                  "(NgramDrafter, SuffixDrafter)")
        raise ValueError(
            f"the {role} model has layers of kind {named}: hf-spec rolls the cache back after rejected "
            "drafts and masks each row by itself, which it can do for full and sliding-window attention (and layers "
            "that reuse those keys and values) only, not for chunked attention, linear attention or other recurrent "
            f"states; {advice}")


#: Positions a sliding-window layer of :class:`RaggedCache` keeps beyond its window W, besides the largest verify
#: block (``logits_to_keep > 1`` after cached positions; not a prompt's rest nor a draft's catch-up): a rollback of
#: up to that many positions below the last :meth:`RaggedCache.truncate` (a drafter's cache resumed for a
#: conversation whose text differs near its end, the caller's cache handed back at a stop inside the last step's
#: accepted tokens) still finds every key its window reads.
WINDOW_SLACK = 64

#: Attention implementations whose 4D masks :class:`RaggedCache` builds itself for sliding-window models:
#: ``sdpa`` takes a boolean mask (True = attend), ``eager`` an additive float mask.
WINDOW_MASK_IMPLEMENTATIONS = ("sdpa", "eager")


def crop_cache_to(cache, length: int) -> None:
    """Shrink a ``transformers`` cache to its first ``length`` positions (no-op when already shorter).

    ``Cache.crop(n)`` in transformers 5 takes a negative count of tokens to remove.
    """
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


#: model types whose attention adds ALiBi biases (not rotary or learned positions) that they compute from the 2D
#: attention mask (Bloom) or from each key's cache slot (MPT), never from ``position_ids``; Falcon with
#: ``config.alibi`` too (a flag of its config)
ALIBI_MODEL_TYPES = ("bloom", "mpt")
#: model types that take no ``position_ids`` but count positions over the 2D attention mask's ones (Bloom's ALiBi),
#: so that a batch's holes, zeros in the mask, are skipped as ``position_ids`` would skip them
MASK_POSITION_MODEL_TYPES = ("bloom",)


def takes_position_ids(model) -> bool:
    """Whether the model's forward takes ``position_ids`` (read once per class)."""
    return _takes_position_ids(type(model))


@functools.lru_cache(maxsize=None)
def _takes_position_ids(cls) -> bool:
    try:
        return "position_ids" in inspect.signature(cls.forward).parameters
    except (TypeError, ValueError):
        return True


def uses_alibi(config) -> bool:
    """Whether the model's attention adds ALiBi biases (:data:`ALIBI_MODEL_TYPES`, or a config's ``alibi`` flag)."""
    text = config.get_text_config()
    return text.model_type in ALIBI_MODEL_TYPES or bool(getattr(text, "alibi", False))


def positions_from_slots(model) -> bool:
    """Whether the model places each key by its cache slot rather than by ``position_ids`` or the 2D mask (no
    ``position_ids`` in its forward: MPT's ALiBi, decoders whose learned positions start at the cache's length):
    a batch's holes (rejected drafts' slots) would then move every later key, so batches are refused for it."""
    return not takes_position_ids(model) and model.config.get_text_config().model_type not in MASK_POSITION_MODEL_TYPES


def slot_window(model) -> int | None:
    """The window, in cache slots, of a model whose layers mask attention by slot distance inside their own forward
    (beyond the 4D mask and ``position_ids`` hf-spec passes), or ``None``: GPT-Neo's ``local`` layers keep the
    ``window_size`` slots before each query (a ``bias`` buffer indexed by slot). One sequence decoded as a chain
    keeps slots equal to positions (rejected drafts are cropped), so it stays exact; a batch's holes and a tree's
    sibling slots would narrow the window, so both are refused for such a model."""
    text = model.config.get_text_config()
    if text.model_type == "gpt_neo" and "local" in (getattr(text, "attention_layers", None) or []):
        return int(text.window_size)
    return None


def check_key_selection(model, max_length: int) -> None:
    """Refuse a call whose attention would select keys per forward: Doge's dynamic mask keeps the top
    ``keep_window_size`` keys of each query once more are visible, and which those are depends on the forward
    (verified here: a verify forward of several positions picks other keys than plain decoding's steps from the
    first token on). Up to ``keep_window_size`` visible keys (a ``max_length`` within it: every query sees at most
    ``max_length`` tokens, holes and tree siblings masked) it selects nothing, and hf-spec is exact.

    Raises:
        ValueError: ``max_length`` above the model's ``keep_window_size``, saying what fits.
    """
    text = model.config.get_text_config()
    window = getattr(text, "keep_window_size", None) if text.model_type == "doge" else None
    if window is not None and max_length > window:
        raise ValueError(
            f"{type(model).__name__} keeps the top keep_window_size={window} keys of each query by a dynamic mask once "
            f"more are visible, and which keys depends on the forward: a verify forward of several positions selects "
            f"others than plain decoding's steps, so output would silently differ. This call reaches {max_length} "
            f"tokens: keep the prompt plus max_new_tokens within {window}, or decode with plain model.generate")


def check_block_forward(model) -> None:
    """Refuse a target whose forward over several new tokens computes other states than over one token at a time,
    which verification relies on: Dory with ``recurrent_kv_cache_mode="last_loop"`` caches only its last recurrent
    loop's keys and values, so its earlier loops see the block's own tokens through their own keys but past tokens
    through the last loop's (verified here: a verify forward of 2 positions changed the greedy token at the 6th new
    token of a tiny model, logit gap 7e-3; ``"per_loop"``, the default, is exact).

    Raises:
        ValueError: naming the setting and what to do instead.
    """
    text = model.config.get_text_config()
    if text.model_type == "dory" and getattr(text, "recurrent_kv_cache_mode", None) == "last_loop":
        raise ValueError(
            f"{type(model).__name__} with recurrent_kv_cache_mode='last_loop' caches only its last loop's keys and "
            "values, so its earlier loops attend to past tokens through those and to the new tokens through their "
            "own: a verify forward of several positions computes other states than plain decoding's one-token steps, "
            "and output would silently differ. Load it with recurrent_kv_cache_mode='per_loop' (the default), or "
            "decode with plain model.generate")


def check_tree_model(model) -> None:
    """Refuse a model on which a draft tree would not be exact or would not run: a tree's nodes sit at the
    positions of their depth (siblings share one) and see their ancestors only, through a custom 4D mask and
    ``position_ids``. So the attention implementation must take a 4D mask (``sdpa``, ``eager``), the forward must
    take ``position_ids``, positions must not come from ALiBi biases that the model derives from the 2D mask
    or the cache slots (Bloom, MPT, Falcon with ``alibi=True``), and no window may count cache slots
    (:func:`slot_window`: GPT-Neo's local layers).

    Raises:
        ValueError: naming what the model does and what to do instead (draft chains, or another implementation).
    """
    text = model.config.get_text_config()
    name = type(model).__name__
    if uses_alibi(model.config):
        raise ValueError(f"a draft tree puts sibling nodes at the same position, which {name} cannot express: its "
                         "ALiBi attention biases come from the 2D attention mask or the cache slots, not from "
                         "position_ids; draft chains with this model (drop num_tree_nodes)")
    if not takes_position_ids(model):
        raise ValueError(f"a draft tree puts sibling nodes at the same position, which {name} cannot express: its "
                         "forward takes no position_ids (it counts positions from the cache); draft chains with this "
                         "model (drop num_tree_nodes)")
    if (window := slot_window(model)) is not None:
        raise ValueError(f"a draft tree puts sibling nodes in cache slots of their own, and {name}'s local attention "
                         f"layers keep a window of {window} cache slots (not positions), which siblings would narrow: draft "
                         "chains with this model (drop num_tree_nodes)")
    impl = text._attn_implementation
    if impl not in WINDOW_MASK_IMPLEMENTATIONS:
        raise ValueError(f"a draft tree needs a custom 4D attention mask, which hf-spec builds for the 'sdpa' and "
                         f"'eager' attention implementations only; {name} runs {impl!r}: load it "
                         "with attn_implementation='sdpa', or draft chains (no tree)")


def sliding_windows(cache: DynamicCache) -> set[int]:
    """The sliding-window sizes of ``cache``'s layers (``DynamicCache(config=...)`` builds them from a model's config;
    empty for a model of full-attention layers only)."""
    return {layer.sliding_window for layer in cache.layers if getattr(layer, "sliding_window", None)}


def adds_cache_layers(config) -> bool:
    """Whether the model adds cache layers of its own in its first forward, beyond those ``DynamicCache(config=...)``
    builds: Dory's loops (``per_loop``: a copy of each looped layer per loop; the only such model in transformers
    5.25)."""
    return config.get_text_config().model_type == "dory"


class _WindowLayer(DynamicLayer):
    """A sliding-window layer of :class:`RaggedCache`'s own cache: a ``DynamicLayer`` (it keeps what it is given,
    so rollbacks stay exact) that leaves the first ``drop`` slots of what it returns out of what it stores. The
    cache sets ``drop`` for a prompt's forward only, where those slots are out of every later query's window: the
    layer's attention reads them, then they are gone (as transformers' ``DynamicSlidingWindowLayer`` keeps its last
    W - 1 positions)."""

    drop = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        keys, values = super().update(key_states, value_states, *args, **kwargs)
        if self.drop:
            self.keys, self.values = keys[:, :, self.drop:], values[:, :, self.drop:]
        return keys, values


def _zeros_before(states: torch.Tensor, n: int) -> torch.Tensor:
    """``states [B, heads, T, head_dim]`` after ``n`` slots of zeros (itself where ``n <= 0``): positions a window
    layer dropped, which no query of it reads."""
    if n <= 0:
        return states
    return torch.cat([states.new_zeros(*states.shape[:-2], n, states.shape[-1]), states], dim=-2)


def can_hand_back(cache) -> bool:
    """Whether a one-row call of a sliding-window model can continue from ``cache`` and leave its tokens in it
    (:meth:`RaggedCache.hand_back`): a ``DynamicCache`` of full and window layers only (or none yet; ``DummyLayer``
    s, which hold nothing, as Gemma 3n's shared-key layers, may sit among them), not offloaded."""
    return (isinstance(cache, DynamicCache) and not getattr(cache, "offloading", False)
            and all(type(layer) in (DynamicLayer, DynamicSlidingWindowLayer, DummyLayer) for layer in cache.layers))


def _holds(layer) -> bool:
    """Whether a cache layer holds keys and values (not a ``DummyLayer``, nor a layer not filled yet)."""
    return getattr(layer, "is_initialized", False) and getattr(layer, "keys", None) is not None


class RaggedCache:
    """A ``DynamicCache`` whose rows hold sequences of different lengths, with holes where tokens were rejected.

    Sliding-window models (Mistral, Gemma 2/3, Phi-3, Qwen2 with ``use_sliding_window``): a rolled-back cache
    needs the slots a ``DynamicSlidingWindowLayer`` drops, and transformers' window counts cache slots, which a
    batch's holes would shrink. So such a model gets a cache of ``DynamicLayer`` s and 4D masks built here with the
    window counted in each row's positions: a query at position p sees its row's valid slots at positions
    p - W < q <= p on sliding layers (transformers' ``sliding_window_overlay``), everything causal on full ones.
    A sliding layer drops its oldest slots in the prompt's forward (as it stores them) and at each :meth:`truncate`
    once no row can read them again (no caller rolls a prompt back, nor a sequence below the last truncate): those of
    positions at most ``lengths - W - slack`` in every row (slack: :data:`WINDOW_SLACK` plus the largest verify block,
    a block after cached ones whose every position's logits are kept), so it holds about W + slack slots however long
    the sequence, as transformers' own window layer holds W - 1 (a Gemma 3 model's five window layers of six hold
    512-1,024 slots, not the whole context); full layers keep every slot (and every layer of a model that adds
    cache layers of its own, as Dory's loops do).
    Exact at any length, for the ``sdpa`` and ``eager`` attention implementations (:data:`WINDOW_MASK_IMPLEMENTATIONS`).

    Args:
        config: the model config (for ``DynamicCache(config=...)``, which tells which layers slide).
        batch_size: B.
        device: where the masks live (the model's device).
        cache: a ``DynamicCache`` whose layer types are used (e.g. the one ``generate`` prepared, or one a caller
            continues from: :meth:`continue_from`); a new one when ``None``. A sliding-window model decodes in a
            cache of ``DynamicLayer`` s of its own; for one row it takes over the caller's (:meth:`continue_from`) and
            hands the result back (:meth:`hand_back`) where :func:`can_hand_back` says it can.
        role: ``"target"`` or ``"draft"``: whose cache this is, for the refusal's advice (:func:`check_cache_layers`).

    Raises:
        ValueError: before any work, for a model with layers other than full and sliding-window attention
            (:func:`layer_kinds`: chunked attention, linear attention and other recurrent states, which cannot be
            rolled back or masked per row here), and for a sliding-window model whose attention implementation is
            not ``sdpa`` or ``eager``, or whose sliding layers use windows of different sizes.

    Attributes:
        cache: the wrapped ``DynamicCache``.
        caller: for one row of a sliding-window model, the caller's cache that :meth:`hand_back` fills, else
            ``None``.
        valid: ``BoolTensor[B, T]``, which cache slots hold tokens of the row's sequence.
        lengths: ``LongTensor[B]``, the number of valid slots per row (the next position id).
        window: the sliding window W in tokens, or ``None``.
        dropped: the leading cache slots the sliding layers no longer hold (0 without a window): slot s of the
            cache is index ``s - dropped`` of a sliding layer's keys and values, index s of a full layer's.
    """

    def __init__(self, config, batch_size: int, device, cache: DynamicCache | None = None, role: str = "target"):
        # what the model's layers are, from the config (a caller's empty DynamicCache() has no layers yet)
        reference = DynamicCache(config=config)
        check_cache_layers(config, reference, role)
        windows = sliding_windows(reference)
        self.window = min(windows) if windows else None
        cache = cache if cache is not None else reference
        self.valid = torch.zeros(batch_size, 0, dtype=torch.bool, device=device)
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)
        self._sliding: list[bool] = []
        self.dropped = 0  # leading slots the sliding layers dropped (_drop_out_of_window)
        #: ``LongTensor[R, B]`` or ``None``: what the model's ``position_ids`` add to each row's positions (counted
        #: over its valid slots), in R rows: multimodal RoPE (Qwen2-VL and its kin) places the tokens after an image
        #: at positions offset by the image's deltas, in 3 (or 4) rows of ``position_ids``
        self.position_offset = None
        self._slack = WINDOW_SLACK  # positions kept past the window: WINDOW_SLACK + the largest verify block
        self._adds_layers = adds_cache_layers(config)
        self.caller: DynamicCache | None = None
        self._handed = 0  # the slots the caller's cache holds (continue_from, hand_back)
        self._tree_start: int | None = None  # the first slot of the last tree forward's block (keep_path)
        self._prompted = False  # whether a forward ran (the first is the prompt's, after any continue_from)
        self._one_query: bool | None = None  # one-position blocks with a 4D mask (_one_query_mask)
        self._packed: dict[int, bool] = {}  # block size -> packed attention (_packed_attention)
        # ALiBi models build their biases from a 2D mask (Bloom, Falcon with alibi=True: a 4D one fails there): the
        # packed-attention and one-query choices, which pass 4D masks, stay off for them
        self._mask_2d_only = uses_alibi(config)
        if self.window is not None:
            impl = config.get_text_config()._attn_implementation
            if len(windows) > 1 or impl not in WINDOW_MASK_IMPLEMENTATIONS:
                raise ValueError(
                    f"this model attends within sliding windows ({sorted(windows)} tokens) with "
                    f"attn_implementation={impl!r}: hf-spec keeps a rolled-back sliding-window cache exact with "
                    "position-based masks of one window size for 'sdpa' or 'eager' attention only; load the model "
                    "with attn_implementation='sdpa'")
            self._sliding = [bool(getattr(layer, "sliding_window", None)) for layer in reference.layers]
            if batch_size == 1 and cache is not reference and can_hand_back(cache):
                self.caller = cache
            # layers that keep every slot they are given (rollbacks need slots past the window), window layers that
            # can leave a prompt's oldest slots out as they store it (forward)
            cache = DynamicCache()
            cache.layers = [_WindowLayer() if sliding else DynamicLayer() for sliding in self._sliding]
        self.cache = cache

    def continue_from(self, length: int) -> None:
        """Take the ``length`` slots the wrapped cache already holds (one row, no holes: a prompt's first tokens,
        as ``generate`` continues from a cache it returned or a prefix filled by a forward) as the row's first
        tokens, so the next :meth:`forward` runs over the rest of the prompt at positions from ``length`` on. For a
        sliding-window model the caller's layers are copied in: full layers whole, window layers as they are (the
        positions they dropped count as :attr:`dropped` slots).

        Raises:
            ValueError: a layer of the caller's cache holds more positions than ``length``, or a full layer fewer."""
        if self.valid.shape[1]:
            raise RuntimeError("continue_from() comes before any forward")
        if self.caller is not None:  # a sliding-window model: the caller's layers become this cache's
            held = {i: layer for i, layer in enumerate(self.caller.layers) if _holds(layer)}  # not DummyLayers
            for i, layer in held.items():
                gone = length - layer.keys.shape[-2]
                if gone < 0 or (gone and not getattr(layer, "sliding_window", None)):
                    raise ValueError(f"the cache passed holds {layer.keys.shape[-2]} positions in layer {i} and "
                                     f"{length} in its first: pass a cache filled by this model's forwards")
            # the positions the window layers dropped stay dropped (a query at position p >= length reads p - W < q
            # there, the W - 1 positions they kept); a window layer that kept more than the others gets zeros, and
            # so does every one of a cache with layers the config does not list (Dory's loops: _drop_out_of_window)
            known = len(self.caller.layers) <= len(self._sliding)
            self.dropped = min((length - layer.keys.shape[-2] for i, layer in held.items() if self._sliding[i]),
                               default=0) if known else 0
            for i, layer in held.items():
                pad = length - layer.keys.shape[-2] - self._offset(i)
                self.cache.update(_zeros_before(layer.keys, pad), _zeros_before(layer.values, pad), i)
            self._handed = length
        self.valid = torch.ones(self.valid.shape[0], length, dtype=torch.bool, device=self.valid.device)
        self.lengths = torch.full_like(self.lengths, length)

    def hand_back(self, length: int) -> bool:
        """(One row of a sliding-window model, :attr:`caller` set.) Give the caller's cache this row's first
        ``length`` slots: each of its layers gets the slots it does not hold through its own ``update``, so a
        window layer keeps its last W - 1 positions as ``generate`` leaves it and plain decoding can continue
        from it. Returns ``False``, and leaves the caller's cache as it was, where its layers do not match this
        cache's one to one (a model that adds cache layers of its own on the first forward, as Dory's loops do)."""
        filled = [i for i, layer in enumerate(self.cache.layers) if _holds(layer)]
        if self.caller.layer_class_to_replicate is None and \
                filled != [i for i, layer in enumerate(self.caller.layers) if type(layer) is not DummyLayer]:
            return False
        if length > self._handed:
            for i in filled:
                layer, offset = self.cache.layers[i], self._offset(i)
                first = max(self._handed - offset, 0)
                # slots a sliding layer dropped (older than the caller's window keeps: WINDOW_SLACK): zeros, which
                missing = min(offset, length) - self._handed  # its update drops at once
                self.caller.update(_zeros_before(layer.keys[:, :, first:length - offset], missing),
                                   _zeros_before(layer.values[:, :, first:length - offset], missing), i)
            self._handed = length
        return True

    def _offset(self, layer: int) -> int:
        """Where slot 0 of the cache's layer ``layer`` sits among the cache's slots: :attr:`dropped` for a sliding
        layer, 0 for a full one."""
        return self.dropped if layer < len(self._sliding) and self._sliding[layer] else 0

    def _masks(self, model, position_ids: torch.Tensor, within: torch.Tensor | None = None):
        """4D masks for the last ``n`` slots' queries, in the attention implementation's format: a tensor
        ``[B, 1, n, T]`` when every layer is alike, else ``{"full_attention": ..., "sliding_attention": ...}``.

        A query sees its row's valid slots before the block, and within the block the slots ``within[b, i]``
        (``BoolTensor[B, n, n]``; default: causal, the slots up to its own). With a sliding window W (the class
        docstring) a sliding layer's query at position p sees only keys at positions p - W < q <= p, positions
        counted per row (``position_ids [B, n]`` for the block, valid slots before it). A filler query also sees
        its own slot, so no row is empty (its output is never used)."""
        total, n = self.valid.shape[1], position_ids.shape[1]
        old = total - n
        slots = torch.arange(total, device=self.valid.device)
        if within is None:
            within = (slots[None, old:] <= slots[old:, None])[None]  # causal within the block
        seen = self.valid[:, None, :].expand(-1, n, -1).clone()  # [B, n, T]
        seen[:, :, old:] &= within
        key_positions = None
        if self.window is not None:
            key_positions = torch.cat([self.valid[:, :old].to(torch.long).cumsum(dim=1) - 1, position_ids], dim=1)
        return self._format_masks(model, seen, position_ids, key_positions)

    def _format_masks(self, model, seen: torch.Tensor, position_ids: torch.Tensor, key_positions: torch.Tensor | None):
        """The masks of :meth:`_masks` from ``seen [B, n, T]`` (which slots each of the last n slots' queries sees,
        before any window), the queries' ``position_ids [B, n]`` and, with a sliding window, every slot's position
        ``key_positions [B, T]``. Each query also sees its own slot."""
        total, n = seen.shape[2], seen.shape[1]
        slots = torch.arange(total, device=seen.device)
        own = slots[None, :] == slots[total - n:, None]  # [n, T]
        masks = {"full_attention": seen | own}
        if self.window is not None:  # over the slots the sliding layers still hold
            in_window = position_ids[:, :, None] - key_positions[:, None, :] < self.window
            masks["sliding_attention"] = ((seen & in_window) | own)[:, :, self.dropped:]
        if model.config.get_text_config()._attn_implementation == "eager":
            dtype = model.dtype
            masks = {kind: torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill(~m, torch.finfo(dtype).min)
                     for kind, m in masks.items()}
        masks = {kind: m[:, None] for kind, m in masks.items()}
        if self.window is None:
            return masks["full_attention"]
        return masks["sliding_attention"] if all(self._sliding) else masks

    def forward(self, model, block: torch.LongTensor, block_valid: torch.Tensor | None = None, logits_to_keep: int = 1,
                parents: torch.Tensor | None = None, positions: torch.Tensor | None = None, model_masks: bool = False,
                **model_kwargs):
        """Run ``model`` over a block of new tokens appended to every row, and keep them in the cache.

        Args:
            model: a ``transformers`` causal LM.
            block: ``LongTensor[B, n]``, the tokens to feed; filler tokens where ``block_valid`` is False.
            block_valid: ``BoolTensor[B, n]``, which block tokens are real (default: all). Filler tokens are
                hidden from every query and stay holes.
            logits_to_keep: how many trailing positions to compute logits for.
            parents: for a draft tree, ``LongTensor[B, n - 1]``: the block is the root (the last verified token)
                then the tree's nodes, node j's parent is ``parents[:, j]`` (``-1``: the root; an earlier node).
                Each node then sees the prefix, the root and its ancestors only (a tree attention mask, as in
                SpecInfer and Medusa), at the position of its depth; after acceptance :meth:`keep_path` keeps the
                accepted path. ``None``: a chain (each token sees the ones before it).
            positions: the ``position_ids`` the model gets for this block, in place of the ones counted from the
                cache (each row's next positions, plus :attr:`position_offset`): the prompt's as ``generate`` made them
                (multimodal RoPE: ``[3 or 4, B, n]``).
            model_masks: pass the model the 2D mask, from which it builds its attention masks itself, as in
                ``generate``'s prefill (an image's bidirectional attention, Gemma 3's, comes from the model's own
                masks and its ``token_type_ids``); only for a block that leaves no holes (a prompt).
            **model_kwargs: passed to ``model`` (e.g. ``output_hidden_states``).

        Returns:
            the model output (``logits [B, logits_to_keep, V]``).

        Raises:
            ValueError: a tree for a model whose attention implementation takes no custom 4D mask (only
                ``sdpa`` and ``eager`` do here), or parents that are not earlier nodes.
        """
        if block_valid is None:
            block_valid = torch.ones_like(block, dtype=torch.bool)
        block_valid = block_valid.to(self.valid.device)
        if model_masks and (self.dropped or parents is not None or not bool(self.valid.all())):
            raise ValueError(
                "images and other media go into a prompt's forward, on the model's own attention masks, which a cache "
                "with holes or with sliding-window layers that dropped slots cannot take (a conversation continued "
                "from a sliding-window model's cache): pass the whole conversation as input_ids without a cache")
        within = None
        if parents is None:
            offsets = block_valid.to(torch.long).cumsum(dim=1) - 1
        else:
            offsets, within = self._tree(model, parents.to(self.valid.device), block_valid)
            self._tree_start = self.valid.shape[1]
        position_ids = (self.lengths[:, None] + offsets).clamp(min=0)
        n, cached = block.shape[1], self.valid.shape[1] > 0
        if cached and logits_to_keep > 1:  # a verify block (every position scored): a stop inside it may hand back
            self._slack = max(self._slack, WINDOW_SLACK + n)  # slots up to its start (hand_back); not a catch-up's
        prompt = not self._prompted
        if prompt:  # a prompt: the attention choices are measured here, not inside a timed decoding step
            measure_attention_choices(model.config, model.dtype, self.valid.device)
            self._prompted = True
        self.valid = torch.cat([self.valid, block_valid], dim=1)
        packed = not model_masks and cached and not self._mask_2d_only and self._packed_attention(model, n)
        if model_masks or self.window is None and within is None and not packed and \
                not (n == 1 and not self._mask_2d_only and self._one_query_mask(model)):
            mask = self.valid.to(torch.long)  # transformers builds the causal mask from the 2D one
        else:
            mask = self._masks(model, position_ids, within)
        # nothing rolls a prompt back: the slots of its own that no later query's window reads are never stored
        # (each window layer keeps the rest as it goes, so the forward never holds every layer's whole prompt)
        drop = self._droppable(self.lengths + block_valid.sum(dim=1)) if prompt else 0
        window_layers = [layer for layer in self.cache.layers if isinstance(layer, _WindowLayer)] if drop else []
        if positions is None and self.position_offset is not None:  # multimodal RoPE after an image
            positions = position_ids[None] + self.position_offset[:, :, None]
        for layer in window_layers:
            layer.drop = drop
        try:
            with self._attention(packed):
                out = model(input_ids=block, attention_mask=mask,
                            position_ids=position_ids if positions is None else positions, use_cache=True,
                            logits_to_keep=logits_to_keep, **{cache_kwarg(model): self.cache}, **model_kwargs)
        finally:
            for layer in window_layers:
                layer.drop = 0
        self.dropped += drop
        self.lengths = self.lengths + (block_valid.sum(dim=1) if parents is None else block_valid[:, :1].sum(dim=1))
        return out

    def _one_query_mask(self, model) -> bool:
        """Whether one-position blocks get an explicit 4D mask (:func:`~hf_spec.kernels.one_query_mask_pays`:
        transformers' ``sdpa`` attention runs a slower CPU kernel for one grouped-query query without a mask),
        decided once per cache."""
        if self._one_query is None:
            self._one_query = one_query_mask_pays(model.config, model.dtype, self.valid.device)
        return self._one_query

    def _packed_attention(self, model, n: int) -> bool:
        """Whether a block of ``n`` positions after cached ones attends through packed grouped-query attention
        (:func:`~hf_spec.kernels.packed_attention_pays`, with the 4D mask built here), decided once per cache and
        block size."""
        choice = self._packed.get(n)
        if choice is None:
            choice = self._packed[n] = packed_attention_pays(model.config, model.dtype, self.valid.device, n)
        return choice

    @staticmethod
    def _attention(packed: bool):
        """The context a forward runs in: :func:`~hf_spec.kernels.packed_attention` where :meth:`_packed_attention`
        chose it for a block after cached positions, else nothing."""
        return packed_attention() if packed else contextlib.nullcontext()

    @staticmethod
    def _tree(model, parents: torch.Tensor, block_valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(depth [B, n], sees [B, n, n])`` for a block of the root and a tree's nodes: each slot's depth (the
        root 0) and which block slots each one sees (itself, its ancestors, the root; filler: itself only)."""
        from .acceptance import check_parents

        check_tree_model(model)
        bsz, n = block_valid.shape
        real = block_valid[:, 1:]
        check_parents(parents, real.sum(dim=1))
        parents = torch.where(real, parents, -2)  # filler: no ancestors
        sees = torch.zeros(bsz, n, n, dtype=torch.bool, device=parents.device)
        sees[:, 0, 0] = True
        rows = torch.arange(bsz, device=parents.device)
        for j in range(1, n):
            up = parents[:, j - 1] + 1  # the parent's slot (-1: none)
            sees[:, j] = torch.where((up >= 0)[:, None], sees[rows, up.clamp(min=0)], False)
            sees[:, j, j] = True
        # a slot's depth is the number of its ancestors (the root included); the root and filler see only themselves
        depth = sees.sum(dim=-1) - 1
        return depth, sees

    def keep_path(self, num_accepted: torch.Tensor, path: torch.Tensor) -> None:
        """After a tree's forward: keep the root and each row's accepted path (``num_accepted [B]``, ``path [B, D]``
        node indices from the root's child down, as :func:`~hf_spec.acceptance.greedy_accept_tree` returns them),
        moved right after the root in the cache, and drop every other node (the block's tail is cropped)."""
        start = self._tree_start  # the block of the last forward: the root, then the tree's nodes
        if start is None:
            raise RuntimeError("keep_path() follows a forward(..., parents=...) of a draft tree")
        width, depth = self.valid.shape[1] - start, path.shape[1]
        index = torch.zeros(self.valid.shape[0], width, dtype=torch.long, device=self.valid.device)
        if depth:
            index[:, 1:1 + depth] = (path.to(index.device) + 1).clamp(min=0)
        for i, layer in enumerate(self.cache.layers):
            if getattr(layer, "keys", None) is None:  # a DummyLayer holds nothing (SUPPORTED_LAYER_KINDS)
                continue
            first = start - self._offset(i)  # the block's first slot in this layer
            for name in ("keys", "values"):
                t = getattr(layer, name)
                tail = t[:, :, first:].gather(2, index[:, None, :, None].expand(-1, t.shape[1], -1, t.shape[3]))
                t[:, :, first:] = tail
        keep = torch.arange(width, device=self.valid.device)[None, :] <= num_accepted.to(self.valid.device)[:, None]
        self.valid[:, start:] = keep & self.valid[:, start:start + 1]
        self.lengths = self.lengths + num_accepted.to(self.lengths.device)
        self._tree_start = None
        self.truncate(self.lengths)

    def truncate(self, keep: torch.Tensor) -> None:
        """Keep only the first ``keep[b]`` tokens of each row's sequence; later ones become holes.

        A sliding-window model's sliding layers then drop the slots no later query can read (the class docstring),
        so a later call may keep no fewer tokens than this one, less the slack (:meth:`can_truncate`).

        Args:
            keep: ``LongTensor[B]``, at most ``lengths``.

        Raises:
            ValueError: a row would keep fewer tokens than :meth:`can_truncate` allows (its window would read keys a
                sliding layer dropped).
        """
        keep = keep.to(self.lengths.device)
        if not self.can_truncate(keep):
            raise ValueError(f"cannot roll the cache back to {keep.tolist()} tokens: its sliding-window layers dropped "
                             f"the keys of the first {self._dropped_positions().tolist()} positions, which a window of "
                             f"{self.window} read from there; start a new RaggedCache")
        self.valid = self.valid & (self.valid.to(torch.long).cumsum(dim=1) <= keep[:, None])
        self.lengths = torch.minimum(self.lengths, keep)
        used = self.valid.any(dim=0).nonzero()
        total = int(used[-1]) + 1 if used.numel() else 0
        if total < self.valid.shape[1]:
            if self.window is None:
                crop_cache_to(self.cache, total)
            else:  # every layer ends at the last slot: the same count off each one's tail
                self.cache.crop(total - self.valid.shape[1])
            self.valid = self.valid[:, :total]
        self._drop_out_of_window()

    def _dropped_positions(self) -> torch.Tensor:
        """``LongTensor[B]``: how many of each row's first positions the sliding layers dropped."""
        return self.valid[:, :self.dropped].sum(dim=1)

    def can_truncate(self, keep: torch.Tensor) -> bool:
        """Whether :meth:`truncate` can keep ``keep`` (``LongTensor[B]``) tokens of each row: always without a
        window or before the sliding layers dropped anything; else where every row keeps at least W - 1 positions
        past those dropped (the keys a query at position ``keep`` reads on a sliding layer)."""
        if not self.dropped:
            return True
        dropped = self._dropped_positions()
        return bool(((dropped == 0) | (keep.to(dropped.device) >= dropped + self.window - 1)).all())

    def _droppable(self, lengths: torch.Tensor) -> int:
        """How many more leading slots no query of a sliding layer reads again once the rows hold ``lengths``
        (``LongTensor[B]``) tokens (the class docstring): those holding, in every row, a position at most
        ``lengths - W - slack`` or nothing (holes, left padding). None where the model adds cache layers of its own
        (:func:`adds_cache_layers`: which of those slide is its own bookkeeping, so every slot stays)."""
        if self.window is None or not any(self._sliding) or self._adds_layers or \
                len(self.cache.layers) > len(self._sliding):
            return 0
        # slot s may go for row b when its valid slots up to s hold positions <= lengths - W - slack only
        limit = lengths - self.window - self._slack + 1
        count = (self.valid.to(torch.long).cumsum(dim=1) <= limit[:, None]).sum(dim=1)
        return max(0, int(count.min()) - self.dropped) if count.numel() else 0

    def _drop_out_of_window(self) -> None:
        """Drop the leading slots of the sliding layers that :meth:`_droppable` names."""
        drop = self._droppable(self.lengths)
        if drop:
            for i, layer in enumerate(self.cache.layers):
                if self._sliding[i] and _holds(layer):
                    layer.keys, layer.values = layer.keys[:, :, drop:], layer.values[:, :, drop:]
            self.dropped += drop

    def select(self, rows: torch.LongTensor) -> None:
        """Keep only the given batch rows (drop finished ones).

        Args:
            rows: ``LongTensor[B']``, indices into the current batch.
        """
        rows = rows.to(self.valid.device)
        self.cache.batch_select_indices(rows)
        self.valid = self.valid[rows]
        self.lengths = self.lengths[rows]
        if self.position_offset is not None:
            self.position_offset = self.position_offset[:, rows]
        self.truncate(self.lengths)  # crop slots that only the dropped rows used
