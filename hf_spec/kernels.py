"""CPU kernels chosen by measuring them on the machine: a faster linear layer for verify forwards of a few positions
(float32), the attention paths of grouped-query models (below), and the int8 and int4 drafts.

Verifying k+1 drafted positions should cost about one decode step: decoding is bound by reading the
weights, and k+1 rows read them once. On some CPUs PyTorch's float32 ``F.linear`` (``x @ W.T``) for 2..16
rows does not behave that way: on an AVX2 machine this project was developed on, one Qwen2.5-Coder-1.5B
forward over 2 positions took 2.1x a one-position forward, over 4 positions 3.6x, while computing the same
product as ``(W @ x.T).T`` read the weight matrix once for all rows (1.6x for 4 positions; see
docs/benchmarks.md). On others it is the other way round: on an AVX-512 Xeon hf-spec's float32 verify step
with that form was slower than transformers' (TPOT 223 ms against 188 ms at k = 3).

So the form is chosen by measuring, per machine and process: the first time a routed layer sees a
verify-sized input (2..128 float32 CPU rows), both forms are timed on that layer's own weight (at most
2^24 elements of it: its first rows, for a vocabulary projection) with a random input of the row count
rounded up to a power of two (the bucket: 2, 4, 8, .., 128): one warm-up and :data:`REPEATS` runs of
each, alternating, fastest runs compared. ``(W @ x.T).T`` is used only where its fastest run is below
``1 - MARGIN`` times ``F.linear``'s. The fastest, not the median: noise on a shared CPU only adds time,
and on a 2-core VM with other processes running most runs of a ~1 ms product took a 24 ms scheduler
slice (2026-12-01, docs/benchmarks.md), so medians compared the scheduler, not the forms. The choice is
cached per (weight shape, bucket, dtype) for the process (:func:`measured_forms`). One choice reads the
weight 12 times, once per shape and bucket, inside the first verify forward that needs it. The weight is
cache-warm there, which a matrix small enough for the CPU caches is not in a real forward (other layers
evict it).

:func:`verify_linear` switches plain ``torch.nn.Linear`` modules of a model to that choice *only* inside a
``with`` block, and only for float32 CPU inputs of 2..128 rows (a batch's verify forward has B x (k+1));
everywhere else (plain decoding, prefill, other devices, quantized or hooked linear layers) the module runs
its own ``forward``. Either form is the same product with another summation order: float32 rounding
differences (~1e-6 relative), which the greedy exactness tests bound as near-ties.

The same per-machine measurement chooses how a one-position forward attends (:func:`one_query_mask_pays`):
transformers' ``sdpa`` attention runs a single grouped-query query without an attention mask through a CPU kernel
that took 4-11x as long in bfloat16 as the packed form it uses with a mask; :class:`~hf_spec.ragged.RaggedCache`
then passes a 4D mask for one-position blocks (a target's plain step, a draft model's drafting step). And blocks of
2..64 positions after cached ones (verify forwards), which carry a 4D mask, attend with the query heads packed into
the query length (:func:`packed_sdpa_attention`) instead of transformers' ``repeat_kv`` copy of every key/value head
where that measured faster (:func:`packed_attention_pays`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
import warnings
from typing import Callable

import torch
import torch.nn.functional as F

try:  # transformers with heterogeneous (per-layer) configs
    from transformers.integrations.heterogeneity.configuration_utils import (
        AmbiguousGlobalPerLayerAttributeError as _PerLayerAttribute)
except ImportError:  # older transformers: every attribute is global
    _PerLayerAttribute = ()

__all__ = ["verify_linear", "install_verify_linear", "install_upcast_prefill", "quantize_draft_int8", "is_int8_draft",
           "quantize_draft_int4", "is_int4_draft", "draft_kind",
           "measure_forms", "measured_forms", "mm_is_faster", "NEAR_TIE_BOUNDS",
           "measure_gqa_attention", "one_query_mask_pays", "measured_attention", "packed_attention_pays",
           "packed_sdpa_attention", "packed_attention", "measure_attention_choices", "extra_rows", "route_extra_rows",
           "one_product_pays", "measure_extra_rows", "measured_extra_rows", "ExtraRows", "measuring_seconds"]

#: Largest top-1/top-2 logit gap at which a greedy speculative output may first differ from plain decoding by
#: rounding alone (a near-tie), by compute: a verify forward over k+1 positions rounds differently from k+1
#: one-position forwards. Measured verify-vs-decode logit differences (docs/user-guide.md, "Verify forwards and
#: 4-bit kernels"): ~5e-5 in float32 (and NF4 with float32 compute); a few bfloat16 steps of 0.125-0.25 at
#: logits of 16-32; 0.33 / 0.69 for gptqmodel's CPU AWQ layers, which compute in bfloat16 inside.
#: The greedy exactness tests use these bounds.
NEAR_TIE_BOUNDS = {"float32": 1e-3, "bfloat16": 0.5, "awq": 1.0}

_STATE = threading.local()
#: verify forwards of 2..128 rows (a batch of 16 verifying 8 positions each) are candidates for (W @ x.T).T
_MIN_ROWS, _MAX_ROWS = 2, 128
#: only weights of at least this many elements are candidates: smaller ones stay in the CPU caches, where
#: F.linear is as fast or faster (measured on SmolLM2's 576x576 projections), and are not worth a measurement
_MIN_WEIGHT = 1 << 20
#: a measurement times at most this many weight elements (64 MiB in float32): the first rows of a larger matrix
_BENCH_MAX_WEIGHT = 1 << 24
#: timed runs of each form per choice (after one warm-up each), alternating; their fastest are compared
REPEATS = 5
#: (W @ x.T).T is used only where its fastest run is below (1 - MARGIN) x F.linear's
MARGIN = 0.1
_UPCAST_MIN_ROWS = 48

#: (out_features, in_features, rows bucket, dtype) -> (F.linear seconds, (W @ x.T).T seconds), fastest runs
_MEASURED: dict[tuple, tuple[float, float]] = {}
_MEASURE_LOCK = threading.RLock()  # re-entrant: one product's measurement can ask for another's form (float32)
_MEASURING = threading.local()  # per thread: seconds spent measuring (measuring_seconds), and whether inside one


def _mm_form(weight: torch.Tensor, x2d: torch.Tensor) -> torch.Tensor:
    """``x2d @ weight.T`` computed as ``(weight @ x2d.T).T`` (one pass over the weight for all rows)."""
    return torch.mm(weight, x2d.t()).t()


def time_form(name: str, fn: Callable[[], torch.Tensor]) -> float:
    """Seconds one call of ``fn`` takes (``name``: ``"linear"`` or ``"mm"``, the form it computes). Tests
    replace this module attribute with a synthetic timer."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _bucket(rows: int) -> int:
    """``rows`` rounded up to a power of two (2, 4, .., 128)."""
    return 1 << (rows - 1).bit_length()


@torch.no_grad()
def measure_forms(weight: torch.Tensor, rows: int, repeats: int = REPEATS) -> tuple[float, float]:
    """Seconds of the fastest run of ``F.linear(x, W)`` and of ``(W @ x.T).T`` for a random ``x`` of ``rows``
    rows, on ``weight`` (at most its first 2^24 elements): one warm-up and ``repeats`` runs of each,
    alternating, each timed by :func:`time_form`."""
    keep = max(1, min(weight.shape[0], _BENCH_MAX_WEIGHT // max(1, weight.shape[1])))
    w = weight.detach()[:keep]
    # a generator of its own: the global one is the sampler's, and a measurement inside a call must not move it
    x = torch.randn(rows, w.shape[1], dtype=w.dtype, generator=torch.Generator().manual_seed(0)).to(w.device)
    fastest = _fastest({"linear": lambda: F.linear(x, w), "mm": lambda: _mm_form(w, x)}, repeats, time_form)
    return fastest["linear"], fastest["mm"]


def _fastest(forms: dict[str, Callable[[], torch.Tensor]], repeats: int, timer) -> dict[str, float]:
    """Each form's fastest of ``repeats`` timed runs (``timer(name, fn)`` seconds), after one warm-up run each,
    the forms alternating run by run."""
    runs: dict[str, list[float]] = {name: [] for name in forms}
    for i in range(repeats + 1):
        for name, fn in forms.items():
            t = timer(name, fn)
            if i:  # the first run of each warms up
                runs[name].append(t)
    return {name: min(times) for name, times in runs.items()}


def _measured_once(store: dict, key: tuple, measure: Callable[[], tuple[float, float]]) -> tuple[float, float]:
    """``store[key]``, measured by ``measure()`` the first time (one measurement at a time: concurrent ones would
    time each other)."""
    times = store.get(key)
    if times is None:
        with _MEASURE_LOCK:
            times = store.get(key)
            if times is None:
                outer = not getattr(_MEASURING, "inside", False)  # a nested measurement's time is the outer one's
                _MEASURING.inside, t0 = True, time.perf_counter()
                try:
                    times = store[key] = measure()
                finally:
                    if outer:
                        _MEASURING.inside = False
                        _MEASURING.seconds = measuring_seconds() + time.perf_counter() - t0
    return times


def measuring_seconds() -> float:
    """Seconds this thread has spent so far in this module's one-time measurements (the first forward of a shape
    measures its kernels inside it): the loop leaves them out of the step times that adaptive k and the tree size
    judge by, which would otherwise take a one-time cost for that step's."""
    return getattr(_MEASURING, "seconds", 0.0)


def measured_forms() -> dict[tuple, tuple[float, float]]:
    """What this process measured so far: ``(out_features, in_features, rows bucket, dtype)`` ->
    ``(F.linear seconds, (W @ x.T).T seconds)`` (fastest runs); a key uses ``(W @ x.T).T`` where the second is
    below ``(1 - MARGIN)`` times the first."""
    return dict(_MEASURED)


def mm_is_faster(weight: torch.Tensor, rows: int) -> bool:
    """Whether ``(W @ x.T).T`` beats ``F.linear`` by :data:`MARGIN` on ``weight`` for ``rows`` rows on this
    machine: measured (:func:`measure_forms`, with the row count rounded up to a power of two) the first time
    a shape, bucket and dtype are asked about, then cached for the process."""
    key = (weight.shape[0], weight.shape[1], _bucket(rows), weight.dtype)
    times = _measured_once(_MEASURED, key, lambda: measure_forms(weight, key[2]))
    return times[1] < (1 - MARGIN) * times[0]


#: context length (cached positions) of the grouped-query attention measurements
ATTENTION_CONTEXT = 512
#: the packed form (a 4D mask) is used for one query only where its fastest run is under this fraction of
#: enable_gqa's: a forward also builds the mask every step, and the int8 draft's float32 forwards, whose kernel alone
#: measured 1.3-1.9x faster packed, were 1.12-1.14x slower with the mask (docs/results/issue21_one_query_attention)
ATTENTION_RATIO = 0.5
#: blocks of 2..this many queries after cached positions (verify forwards, a draft model's catch-up) are candidates for
#: packed attention (:func:`packed_attention_pays`); a longer block is a prompt, where transformers' causal kernel stays
PACKED_MAX_QUERIES = 64
#: (key/value heads, query heads per key/value head, head size, dtype, threads, queries bucket) ->
#: (transformers' form s, packed s)
_ATTENTION_MEASURED: dict[tuple, tuple[float, float]] = {}
#: the query-count buckets measured in a prompt's forward (:func:`measure_attention_choices`)
PACKED_BUCKETS = (2, 4, 8, 16, 32, 64)
#: whether this thread is inside :func:`packed_attention`
_ATTENTION_STATE = threading.local()


def time_attention(name: str, fn: Callable[[], torch.Tensor]) -> float:
    """Seconds one call of ``fn`` takes (``name``: ``"transformers"`` or ``"packed"``, the form it computes).
    Tests replace this module attribute with a synthetic timer."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _pack_queries(query: torch.Tensor, groups: int) -> torch.Tensor:
    """``query [B, H, n, d]`` of a grouped-query layer (query head h reads key/value head h // groups, as
    transformers' ``repeat_kv`` orders them) as ``[B, H / groups, groups * n, d]``: each key/value head's queries
    in one sequence, query ``(r, i)`` at ``r * n + i``."""
    b, h, n, d = query.shape
    return query.reshape(b, h // groups, groups * n, d)


@torch.no_grad()
def measure_gqa_attention(kv_heads: int, groups: int, head_dim: int, dtype: torch.dtype, queries: int = 1,
                          context: int = ATTENTION_CONTEXT, repeats: int = 6 * REPEATS) -> tuple[float, float]:
    """Seconds of the fastest run of each form of grouped-query attention for ``queries`` new queries on the CPU,
    over ``context`` cached positions with random inputs (``q [1, H, n, d]``, ``k, v [1, H_kv, context, d]``):

    - transformers' ``sdpa`` form: for one query without a mask (a row without padding: the 2D mask of ones is
      dropped), ``F.scaled_dot_product_attention(q, k, v, enable_gqa=True)``; for several, which always come with a
      4D mask after cached positions, ``k`` and ``v`` repeated per query head (``repeat_kv``) and the mask;
    - packed: the query heads folded into the query length (:func:`_pack_queries`) against the unrepeated ``k, v``,
      the mask repeated per query head (what transformers runs for one query *with* a mask: its ``pack_gqa``).

    One warm-up and ``repeats`` runs of each, alternating, each timed by :func:`time_attention`."""
    g = torch.Generator().manual_seed(0)  # not the global generator: the sampler's, measured inside a call
    q = torch.randn(1, kv_heads * groups, queries, head_dim, dtype=dtype, generator=g)
    k = torch.randn(1, kv_heads, context, head_dim, dtype=dtype, generator=g)
    v = torch.randn(1, kv_heads, context, head_dim, dtype=dtype, generator=g)
    mask = torch.ones(1, 1, queries, context, dtype=torch.bool)
    mask[0, 0, :, context - queries:] = torch.ones(queries, queries, dtype=torch.bool).tril()
    if queries == 1:  # transformers' own two forms (its pack_gqa broadcasts the one mask row over the heads)
        plain = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
        packed = lambda: F.scaled_dot_product_attention(_pack_queries(q, groups), k, v, attn_mask=mask)  # noqa: E731
    else:  # each timed with the copies it makes per layer (repeat_kv's; the packed query and mask)
        plain = lambda: F.scaled_dot_product_attention(  # noqa: E731
            q, k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1), attn_mask=mask)
        packed = lambda: F.scaled_dot_product_attention(  # noqa: E731
            _pack_queries(q, groups), k, v, attn_mask=mask.repeat(1, 1, groups, 1))
    fastest = _fastest({"transformers": plain, "packed": packed}, repeats, time_attention)
    return fastest["transformers"], fastest["packed"]


def measured_attention() -> dict[tuple, tuple[float, float]]:
    """What this process measured so far: ``(kv heads, groups, head size, dtype, threads, queries bucket)`` ->
    ``(transformers' form seconds, packed seconds)`` (fastest runs; :func:`one_query_mask_pays`,
    :func:`packed_attention_pays`)."""
    return dict(_ATTENTION_MEASURED)


def uniform_attr(config, name: str, default=None):
    """``config.<name>``, or ``default`` where it is unset or set per layer: a heterogeneous config
    (transformers' ``per_layer_config``; Gemma 4's full-attention layers have a ``head_dim`` of their own) raises
    on reading such an attribute globally, and its global value would be wrong for some layers anyway. hf-spec reads
    model shapes through it and, where it gets ``default``, leaves that layer-shape-dependent choice to transformers."""
    try:
        return getattr(config, name, default)
    except _PerLayerAttribute:
        return default


def _gqa_key(config, dtype: torch.dtype, device, queries: int) -> tuple | None:
    """The measurement key of a CPU ``sdpa`` model with grouped-query heads (:data:`_ATTENTION_MEASURED`), or
    ``None`` where hf-spec keeps transformers' attention: other devices (CUDA's fast kernels take no packed
    queries), other attention implementations, models without grouped-query heads, head sizes over 256 and
    ``TRANSFORMERS_SDPA_FORCE_GQA=1`` (where transformers runs ``enable_gqa`` whatever the mask)."""
    text = config.get_text_config()
    heads = uniform_attr(text, "num_attention_heads")
    kv_heads = uniform_attr(text, "num_key_value_heads") or heads
    if (torch.device(device).type != "cpu" or getattr(text, "_attn_implementation", None) != "sdpa" or not heads
            or heads == kv_heads or heads % kv_heads):
        return None
    try:
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    except _PerLayerAttribute:  # head sizes that differ by layer: one measurement would not stand for them
        return None
    if head_dim > 256 or os.environ.get("TRANSFORMERS_SDPA_FORCE_GQA", "0") == "1":
        return None
    return kv_heads, heads // kv_heads, head_dim, dtype, torch.get_num_threads(), queries


def _packed_times(key: tuple) -> tuple[float, float]:
    """The measurement of ``key`` (:func:`_gqa_key`): 30 runs of each form for one query, whose forms differ more
    from machine to machine, 10 for several."""
    repeats = 6 * REPEATS if key[5] == 1 else 2 * REPEATS
    return _measured_once(_ATTENTION_MEASURED, key,
                          lambda: measure_gqa_attention(*key[:4], queries=key[5], repeats=repeats))


def measure_attention_choices(config, dtype: torch.dtype, device) -> None:
    """Make :func:`one_query_mask_pays` and :func:`packed_attention_pays` (every bucket of
    :data:`PACKED_BUCKETS`) measure now, where they have not yet for this model's shapes: a prompt's forward calls
    it, so that the measurements (~0.1 s for Qwen2.5-Coder-1.5B's shapes here) count in the time to the first
    token and not inside a decoding step that adaptive k times."""
    one_query_mask_pays(config, dtype, device)
    for queries in PACKED_BUCKETS:
        packed_attention_pays(config, dtype, device, queries)


def one_query_mask_pays(config, dtype: torch.dtype, device) -> bool:
    """Whether a one-query forward of a model with this config should get an explicit 4D attention mask.

    transformers' ``sdpa`` attention, for one query with grouped-query heads, calls PyTorch with
    ``enable_gqa=True`` when there is no attention mask (plain decoding of a sequence without padding: the 2D
    mask of ones is dropped) and packs the query heads into the query length when there is one. On CPUs the two
    differ: in bfloat16 on an AVX512-BF16 EPYC the first took 4-11x as long (0.18-1.2 ms against 0.04-0.11 ms per
    layer, 300-1500 cached positions; docs/benchmarks.md), several ms of a 0.5B draft's forward; in float32 either
    may win by shape. So it is measured per machine and process (:func:`measure_gqa_attention`, at
    :data:`ATTENTION_CONTEXT` positions, inside the first one-position forward that asks), cached per (kv heads,
    groups, head size, dtype, torch's thread count), and the mask is used where the packed form's fastest run is
    under :data:`ATTENTION_RATIO` (half) of the other's. Both forms compute the same attention (rounding differences
    only, which verification makes harmless: the target decides every token, and the greedy tests bound the
    differences as near-ties).

    Returns ``False`` without measuring for float32 (the packed kernel alone measured from 1.4x slower to 1.9x
    faster there by shape, a whole forward of the int8 0.5B draft 1.12-1.14x slower with the mask; and float32
    targets stay on the path plain ``generate`` takes, where the exactness tests compare bit for bit) and wherever
    :func:`_gqa_key` keeps transformers' attention (not a CPU ``sdpa`` model with grouped-query heads).
    """
    key = _gqa_key(config, dtype, device, 1) if dtype in (torch.bfloat16, torch.float16) else None
    if key is None:
        return False
    times = _packed_times(key)
    return times[1] < ATTENTION_RATIO * times[0]


def packed_attention_pays(config, dtype: torch.dtype, device, queries: int) -> bool:
    """Whether a block of ``queries`` (2..:data:`PACKED_MAX_QUERIES`) new queries after cached positions (a verify
    forward, a draft model's catch-up) should attend through :func:`packed_sdpa_attention`.

    With a 4D mask, which such a block always has, transformers' ``sdpa`` attention repeats every key/value head
    once per query head (``repeat_kv``: a copy of the cache per layer) and runs the many-head kernel; packing the
    query heads into the query length reads each key/value head once. On an AVX512-BF16 EPYC that took 2-4x less
    time for 2-5 queries after 300 positions (2-14x after 1,000, varying between runs) and 1.1-1.3x less for 17, in bfloat16 and float32 (docs/benchmarks.md). Measured per machine
    and process (:func:`measure_gqa_attention` for the query count rounded up to a power of two, at
    :data:`ATTENTION_CONTEXT` positions, inside the first forward that asks), cached per (kv heads, groups, head
    size, dtype, thread count, bucket), and packed where its fastest run is under ``1 - MARGIN`` times the other's.
    The same attention with other rounding (a verify forward already rounds otherwise than one-position forwards:
    the near-tie bounds, :data:`NEAR_TIE_BOUNDS`).

    Returns ``False`` without measuring outside 2..:data:`PACKED_MAX_QUERIES` queries and wherever
    :func:`_gqa_key` keeps transformers' attention (not a CPU ``sdpa`` model with grouped-query heads). Where it
    returns ``True``, :class:`~hf_spec.ragged.RaggedCache` runs the forward inside :func:`packed_attention`."""
    if not 2 <= queries <= PACKED_MAX_QUERIES:
        return False
    key = _gqa_key(config, dtype, device, _bucket(queries))
    if key is None:
        return False
    times = _packed_times(key)
    return times[1] < (1 - MARGIN) * times[0]


def packed_sdpa_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                          **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' ``sdpa`` attention function (``transformers.integrations.sdpa_attention``), except for several
    queries of a grouped-query layer under a 4D mask shared by the heads: those run with the query heads packed
    into the query length against the unrepeated keys and values (:func:`_pack_queries`), the mask repeated per
    query head, instead of transformers' ``repeat_kv``. The attention that runs inside :func:`packed_attention`.

    Args:
        module: the attention layer (``num_key_value_groups`` query heads per key/value head).
        query: ``[B, H, n, d]``; key, value: ``[B, H_kv, T, d]``.
        attention_mask: ``[B or 1, 1, n, T]`` (boolean: True = attend, or additive float), or ``None``.
        dropout, scaling, **kwargs: as transformers' ``sdpa_attention_forward`` takes them.

    Returns:
        ``(attn_output [B, n, H, d], None)``, as transformers' function returns it.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    n = query.shape[2]
    if (groups > 1 and n > 1 and attention_mask is not None and attention_mask.dim() == 4
            and attention_mask.shape[1] == 1 and not dropout and query.shape[1] == key.shape[1] * groups
            and all(kwargs.get(name) is None for name in ("position_bias", "softcap", "s_aux", "sinks"))):
        mask = attention_mask.repeat(1, 1, groups, 1)  # packed query (r, i) sees what query i sees
        out = F.scaled_dot_product_attention(_pack_queries(query, groups), key, value, attn_mask=mask, scale=scaling)
        return out.reshape(out.shape[0], query.shape[1], n, value.shape[-1]).transpose(1, 2).contiguous(), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  **kwargs)


def _sdpa_router(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, **kwargs):
    """transformers' ``sdpa`` attention as :func:`_install_router` registers it: :func:`packed_sdpa_attention` inside
    :func:`packed_attention` on this thread, transformers' own ``sdpa_attention_forward`` everywhere else."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    attend = packed_sdpa_attention if getattr(_ATTENTION_STATE, "packed", False) else sdpa_attention_forward
    return attend(module, query, key, value, attention_mask, **kwargs)


@functools.lru_cache(maxsize=None)
def _install_router() -> bool:
    """Register :func:`_sdpa_router` as the ``sdpa`` attention function in transformers' ``AttentionInterface`` (its
    documented way to supply attention functions; every model that looks ``"sdpa"`` up then calls the router,
    which outside :func:`packed_attention` calls transformers' function as is). Only over transformers' own
    function: where something else registered ``"sdpa"`` it stays, and nothing is packed. Whether the router is
    in place."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    current = ALL_ATTENTION_FUNCTIONS.get("sdpa")
    if current is not sdpa_attention_forward and current is not _sdpa_router:
        return False
    AttentionInterface.register("sdpa", _sdpa_router)
    return True


@contextlib.contextmanager
def packed_attention():
    """Inside the block, on this thread only, transformers' ``sdpa`` attention runs as
    :func:`packed_sdpa_attention`: several queries of a grouped-query layer under a 4D mask shared by the heads (the
    masks :class:`~hf_spec.ragged.RaggedCache` passes) attend packed; everything else as transformers computes it.
    No model or config changes (other threads, and this one after the block, see transformers' function). Nothing
    is packed where another ``sdpa`` function was registered (:func:`_install_router`)."""
    _install_router()
    with _thread_flag(_ATTENTION_STATE, "packed", True):
        yield


def _forward(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    extra = getattr(_EXTRA_STATE, "rows", None)
    if extra is not None and extra.module is module:
        return extra.project(x)
    return _linear(module.weight, module.bias, x)


def _linear(weight: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, weight, bias)``; inside :func:`verify_linear`, ``(W @ x.T).T`` for 2..128 float32 CPU rows
    and weights of at least 2^20 elements where that was measured faster."""
    if getattr(_STATE, "active", False) and x.dtype == torch.float32 and x.device.type == "cpu":
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if _MIN_ROWS <= rows <= _MAX_ROWS and weight.numel() >= _MIN_WEIGHT and mm_is_faster(weight, rows):
            y = _mm_form(weight, x.reshape(rows, x.shape[-1]))
            y = y.reshape(*x.shape[:-1], weight.shape[0])
            return y if bias is None else y + bias
    return F.linear(x, weight, bias)


# ---- extra rows in the target's vocabulary projection ------------------------------------------------------
#: (out_features, in_features, dtype, device type, rows, extra rows, separate rows (the row counts rounded up to
#: multiples of 4), inside verify_linear, threads) -> (seconds of one product over rows + extra rows, of two
#: products, over rows and over separate rows)
_EXTRA_MEASURED: dict[tuple, tuple[float, float]] = {}
_EXTRA_STATE = threading.local()
#: more rows than this in one product (a prompt's positions, a large batch's trees) are never measured or joined
_EXTRA_MAX_ROWS = 512


class ExtraRows:
    """Rows a drafter wants projected by a routed linear layer (the target's ``lm_head``) in the same product as the
    layer's own input, inside :func:`extra_rows`.

    Attributes:
        output: after the layer ran, ``Tensor[B, per_row, out_features]``: the extra rows' projection (its
            last call's, for a forward that calls the layer more than once), or ``None`` where one product was
            measured slower than two (the drafter then projects ``separate`` rows itself).
    """

    def __init__(self, module: torch.nn.Linear, make_rows: Callable[[torch.Tensor], torch.Tensor], per_row: int,
                 separate: int):
        self.module, self.make_rows, self.per_row, self.separate = module, make_rows, per_row, separate
        self.output: torch.Tensor | None = None

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """The layer's forward on ``x [B, n, in_features]``: ``[B, n, out_features]``, with the extra rows
        (``make_rows(x)``, ``[B, per_row, in_features]``) concatenated to ``x`` where that pays (never for an input
        of another shape)."""
        weight, bias = self.module.weight, self.module.bias
        self.output = None
        if x.dim() != 3 or not x.shape[1] or not x.shape[2]:
            return _linear(weight, bias, x)
        batch, n = x.shape[0], x.shape[1]
        rows, extra = batch * n, batch * self.per_row
        if rows + extra > _EXTRA_MAX_ROWS or not one_product_pays(weight, rows, extra, batch * self.separate):
            return _linear(weight, bias, x)
        more = self.make_rows(x)
        if more.shape != (batch, self.per_row, x.shape[2]):
            raise ValueError(f"extra rows of shape {tuple(more.shape)} for an input of {tuple(x.shape)}; expected "
                             f"{(batch, self.per_row, x.shape[2])}")
        y = _linear(weight, bias, torch.cat([x, more.to(x.dtype)], dim=1))
        self.output = y[:, n:]
        return y[:, :n]


@contextlib.contextmanager
def extra_rows(module: torch.nn.Module, make_rows: Callable[[torch.Tensor], torch.Tensor], per_row: int,
               separate: int):
    """Inside the block (on this thread), the routed linear layer ``module`` (:func:`route_extra_rows`) projects
    ``make_rows(x)`` in the same product as its input ``x`` wherever one product over both was measured faster on
    this machine than the layer's product plus a separate one over ``separate`` rows per batch row
    (:func:`one_product_pays`): Medusa heads that share the target's ``lm_head`` read its weights once per step
    instead of twice, as Medusa's own implementation scores its heads inside the target's forward (Cai et al.
    2024, FasterDecoding/Medusa ``medusa_model.py``). The layer's own output is the same product of the same
    rows (other rows beside them can change its float rounding, as a verify forward's width does).

    Args:
        module: the layer (must have been routed by :func:`route_extra_rows`; otherwise nothing happens).
        make_rows: ``x [B, n, in_features] -> [B, per_row, in_features]``, called only where it pays.
        per_row: extra rows per batch row.
        separate: rows per batch row the caller projects itself when the layer does not.

    Yields:
        :class:`ExtraRows`, whose ``output`` holds the extra rows' projection after the layer ran.
    """
    holder = ExtraRows(module, make_rows, per_row, separate)
    previous = getattr(_EXTRA_STATE, "rows", None)
    _EXTRA_STATE.rows = holder
    try:
        yield holder
    finally:
        _EXTRA_STATE.rows = previous


def route_extra_rows(module: torch.nn.Module | None) -> bool:
    """Route one plain ``nn.Linear`` (a target's ``lm_head``) through hf-spec's forward so that :func:`extra_rows`
    can add rows to it (idempotent; outside that block and :func:`verify_linear` the forward is exactly
    ``F.linear``). False for anything else (a quantized or hooked head, a subclass, none, a head with a bias, whose
    rows the drafter projects without it, one on another device than the CPU, where the measurement is not
    made): callers then project their rows themselves."""
    if (type(module) is not torch.nn.Linear or hasattr(module, "_hf_hook") or module.bias is not None
            or module.weight.device.type != "cpu"):
        return False
    return _route_modules([module], _forward) == 1


def one_product_pays(weight: torch.Tensor, rows: int, extra: int, separate: int) -> bool:
    """Whether one product of ``weight`` over ``rows + extra`` rows is faster than two, over ``rows`` and over
    ``separate`` rows, on this machine: measured with the whole weight (a vocabulary projection is bound by reading
    it where the rows are few, by computing where they are many: which one depends on the CPU) the first time a
    shape, dtype, row counts (rounded up to multiples of 4), :func:`verify_linear` state and thread count are asked
    about, then cached for the process. One product is chosen only where it was at least :data:`MARGIN` faster."""
    key = (weight.shape[0], weight.shape[1], weight.dtype, weight.device.type, -(-rows // 4) * 4,
           -(-extra // 4) * 4, -(-separate // 4) * 4, bool(getattr(_STATE, "active", False)), torch.get_num_threads())
    one, two = _measured_once(_EXTRA_MEASURED, key, lambda: measure_extra_rows(weight, *key[4:7]))
    return one < (1 - MARGIN) * two


@torch.no_grad()
def measure_extra_rows(weight: torch.Tensor, rows: int, extra: int, separate: int,
                       repeats: int = REPEATS) -> tuple[float, float]:
    """Seconds of the fastest run of one product over ``rows + extra`` random rows and of two, over ``rows`` and
    over ``separate`` rows, with the whole ``weight`` (one warm-up and ``repeats`` runs of each, alternating,
    timed by :func:`time_form` with names ``"one"`` and ``"two"``; CPU weights: :func:`route_extra_rows` routes no
    other)."""
    w = weight.detach()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows + extra, w.shape[1], generator=gen).to(device=w.device, dtype=w.dtype)
    s = torch.randn(separate, w.shape[1], generator=gen).to(device=w.device, dtype=w.dtype)
    fastest = _fastest({"one": lambda: _linear(w, None, x), "two": lambda: (_linear(w, None, x[:rows]),
                                                                           _linear(w, None, s))}, repeats, time_form)
    return fastest["one"], fastest["two"]


def measured_extra_rows() -> dict[tuple, tuple[float, float]]:
    """What this process measured for :func:`one_product_pays`: key -> (one product s, two products s)."""
    return dict(_EXTRA_MEASURED)


def install_verify_linear(model: torch.nn.Module) -> int:
    """Route the model's plain ``nn.Linear`` modules of at least 2^20 weights through the verify-aware
    forward (idempotent): inside :func:`verify_linear`, ``(W @ x.T).T`` where measured faster on this
    machine (the module docstring), else ``F.linear``. Nothing is measured here: the first verify-sized
    input of each weight shape and rows bucket is.

    Subclasses of ``nn.Linear`` (bitsandbytes, AWQ/GPTQ kernels) and modules with accelerate hooks keep
    their own forward. Outside :func:`verify_linear` the routed forward is exactly ``F.linear``.

    Returns:
        The number of modules routed.
    """
    return _route(model, _forward, _MIN_WEIGHT)


def _route(model: torch.nn.Module, forward, min_weight: int = 0) -> int:
    """Point every plain ``nn.Linear`` of ``model`` (no subclass, no accelerate hook, at least
    ``min_weight`` weight elements) at ``forward``."""
    return _route_modules([m for m in model.modules() if type(m) is torch.nn.Linear and not hasattr(m, "_hf_hook")
                           and m.weight.numel() >= min_weight], forward)


def _route_modules(modules, forward) -> int:
    """Point each of ``modules`` at ``forward``, except those another of hf-spec's forwards already owns (an int8
    draft's bfloat16 down projections stay bfloat16 when the verify-aware forward is installed over the model);
    how many point at ``forward``."""
    count = 0
    for module in modules:
        owner = getattr(module, "_hf_spec_forward", None)
        if owner is None:
            # a partial of a module-level function, not a bound method: the model still pickles and deep-copies
            # (pickle rebuilds a bound method by looking its function's name up on the module, which fails)
            module.forward = functools.partial(forward, module)
            module._hf_spec_forward = owner = forward
        count += owner is forward
    return count


@contextlib.contextmanager
def verify_linear(enabled: bool = True):
    """Inside the block, routed linear layers use ``(W @ x.T).T`` for 2..128 float32 CPU rows where it was
    measured faster than ``F.linear`` on this machine (for that weight shape and rows bucket)."""
    with _thread_flag(_STATE, "active", enabled):
        yield


@contextlib.contextmanager
def _thread_flag(state: threading.local, name: str, value: bool):
    """``state.<name>`` is ``value`` inside the block (on this thread), its previous value (default False) after."""
    previous = getattr(state, name, False)
    setattr(state, name, value)
    try:
        yield
    finally:
        setattr(state, name, previous)


@contextlib.contextmanager
def upcast_prefill(enabled: bool = True):
    """Inside the block (on this thread), the linear layers :func:`install_upcast_prefill` routed compute 48 rows or
    more in float32; outside it they are the model's own ``F.linear``, so a model that also serves as a target, or
    is used on its own later, keeps its rounding."""
    with _thread_flag(_STATE, "upcast", enabled):
        yield


def _upcast_forward(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if rows >= _UPCAST_MIN_ROWS and getattr(_STATE, "upcast", False) and x.device.type == "cpu" and \
            x.dtype in (torch.bfloat16, torch.float16):
        bias = None if module.bias is None else module.bias.float()
        return F.linear(x.float(), module.weight.float(), bias).to(x.dtype)
    return F.linear(x, module.weight, module.bias)


def install_upcast_prefill(model: torch.nn.Module) -> int:
    """For a *draft* model in bfloat16/float16 on a CPU without native bfloat16: compute linear layers over
    48 rows or more (the prompt prefill) in float32. Emulated bfloat16 GEMMs are ~3x slower than upcasting
    the weights and using float32 ones there; one-row decode steps stay in bfloat16, which halves the bytes
    read per drafted token. Only inside :func:`upcast_prefill` (the draft's catch-up forwards), so the model's
    rounding is its own everywhere else: as a target (a model drafting for itself), in plain ``generate``, in
    other threads. A draft's rounding does not affect exactness, which verification guarantees. Idempotent.

    Returns:
        The number of modules routed.
    """
    return _route(model, _upcast_forward)


def _bfloat16_forward(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """A linear layer whose weight (and bias) :func:`quantize_draft_int8` made bfloat16, for inputs of any dtype."""
    return F.linear(x.to(torch.bfloat16), module.weight, module.bias).to(x.dtype)


def quantize_draft_int8(model: torch.nn.Module) -> int:
    """Make a float32 *draft* model on the CPU cheaper per drafted token, in place: its ``nn.Linear`` layers
    become int8 with dynamic activation quantization (weights int8 per output channel; each call quantizes its
    input per tensor at run time; torch's fbgemm kernels, VNNI where the CPU has it), except the MLP down
    projections (into ``hidden_size`` features from the MLP's wider ones), which keep bfloat16 weights
    with float32 inputs and outputs on a CPU with native bfloat16 (float32 weights elsewhere). Their inputs
    carry the few very large activations of these models, which one int8 scale per tensor loses: on
    Qwen2.5-Coder-0.5B over Spec-Bench text the draft's top-1 token agreed with its float32 self at 65% with
    every layer int8 and at 87% with the down projections in bfloat16 (bfloat16 throughout: 98%). They are found
    by shape (:func:`_mlp_down_projections`), so MLPs of sizes that differ by layer keep theirs too. The rest
    (embeddings, norms, attention) stays float32.

    A draft's rounding cannot change the output: the target verifies every drafted token, so a less accurate
    draft only lowers acceptance. Never used on targets. ``torch.ao.quantization.quantize_dynamic`` is
    deprecated in torch 2.13 in favour of torchao, whose int8 CPU paths measured 3-5x slower for one-token
    forwards here (docs/benchmarks.md, "Where a drafting step's time goes").

    Returns:
        The number of layers made int8.

    Raises:
        ValueError: a model that is int8 already, or not float32, or not on the CPU (fbgemm's int8 kernels are
            CPU-only; on a GPU use a bfloat16 draft).
    """
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    from .device import cpu_has_native_bf16

    if is_int8_draft(model) or is_int4_draft(model):
        raise ValueError("this draft model is quantized already (quantize_draft_int8 or quantize_draft_int4 was "
                         "called on it): use it as it is, or load it again")
    params = list(model.parameters())
    if any(p.device.type != "cpu" for p in params) or any(p.dtype != torch.float32 for p in params if p.is_floating_point()):
        raise ValueError("an int8 draft is made from a float32 model on the CPU (torch's dynamic int8 kernels are "
                         "CPU-only): load the draft in float32 on the CPU, or use a bfloat16 draft on a GPU")
    down_ids = {id(m) for m in _mlp_down_projections(model)}
    spec, down = {}, []
    for name, module in model.named_modules():
        if type(module) is torch.nn.Linear and not hasattr(module, "_hf_hook"):
            if id(module) in down_ids:
                down.append(module)
            else:
                spec[name] = per_channel_dynamic_qconfig
    if cpu_has_native_bf16():
        for module in down:
            module.weight.data = module.weight.data.to(torch.bfloat16)
            if module.bias is not None:
                module.bias.data = module.bias.data.to(torch.bfloat16)
        _route_modules(down, _bfloat16_forward)
    with warnings.catch_warnings():  # torch 2.13 deprecates quantized tensors (the note above)
        warnings.simplefilter("ignore", UserWarning)
        quantize_dynamic(model, spec, inplace=True)
    return len(spec)


def _mlp_down_projections(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """The MLP down projections of ``model``: each ``nn.Linear`` into ``hidden_size`` features from more (an MLP's
    wider inner features) or fed by a sibling ``nn.Linear`` out of ``hidden_size`` (a shared expert narrower than
    the model), among the children of a module that is no attention (whose output projection the query projection
    feeds) and no state-space or convolution mixer (a ``Conv1d`` among its children, as in Mamba's and a gated delta
    net's: their output projection reads no MLP's activations). By structure rather than the
    config's one ``intermediate_size``, which heterogeneous configs leave unset or set per layer (Gemma 3n's list,
    Gemma 4's double-wide MLPs), OPT names ``ffn_dim`` and shared experts do not have."""
    hidden = uniform_attr(model.config.get_text_config(), "hidden_size")
    found = []
    for parent in model.modules():
        children = list(parent.children())
        if "attention" in type(parent).__name__.lower() or any(isinstance(c, torch.nn.Conv1d) for c in children):
            continue
        linears = [c for c in children if type(c) is torch.nn.Linear]
        fed = {c.out_features for c in linears if c.in_features == hidden}
        found += [c for c in linears if c.out_features == hidden and (c.in_features > hidden or c.in_features in fed)
                  and c.in_features != hidden]
    return found


def is_int8_draft(model: torch.nn.Module) -> bool:
    """Whether :func:`quantize_draft_int8` made ``model``'s linear layers int8."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    return any(isinstance(m, DynamicLinear) for m in model.modules())


#: Group sizes torch's CPU int4 kernel takes (``_weight_int4pack_mm_for_cpu``): one scale and offset per group of
#: this many input channels of an output row.
INT4_GROUP_SIZES = (32, 64, 128, 256)
#: Inputs of at most this many rows (all rows of the call: batch x positions) use the int4 weights; more rows (the
#: prompt prefill, a large batch) use the bfloat16 ones. A decode forward of Qwen2.5-Coder-0.5B after a 200-token
#: prompt, int4 against bfloat16 weights: 1 row 36 / 119 ms, 8 rows 87 / 148 ms, 16 rows 179 / 196 ms, 32 rows
#: 314 / 267 ms (2026-12-02, the AVX512-BF16 EPYC VM; docs/results/issue21_int4_draft_8x1/measure_shipped.py).
INT4_MAX_ROWS = 16


def _int4_pack(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Round ``weight [N, K]`` to 4 bits per element with one scale and offset per group of ``group_size``
    input channels (asymmetric: each group's minimum and maximum are the ends of its 16 levels), in the layout of
    torch's CPU int4 kernel: ``(packed uint8 [N, K / 2], scales_and_zeros bfloat16 [K / group_size, N, 2])``,
    where the kernel computes ``w = (q - 8) * scale + zero``. The levels are chosen against the bfloat16-rounded
    scale and offset the kernel will use, not their float32 values."""
    n, k = weight.shape
    groups = weight.detach().float().reshape(n, k // group_size, group_size)
    low, high = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
    scale = ((high - low) / 15).to(torch.bfloat16).float().clamp(min=1e-12)
    zero = (low + 8 * scale).to(torch.bfloat16).float()
    q = ((groups - zero) / scale + 8).round().clamp(0, 15).to(torch.int32).reshape(n, k)
    scales_and_zeros = torch.cat([scale, zero], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1), scales_and_zeros


def _int4_forward(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """A linear layer of :func:`quantize_draft_int4`: int4 weights for inputs of few rows, bfloat16 for many (in
    float32 on a CPU without native bfloat16, as :func:`install_upcast_prefill` does for a bfloat16 draft)."""
    rows = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if x2.shape[0] > INT4_MAX_ROWS:
        if module._hf_spec_int4_upcast:
            y = F.linear(x2.float(), module.weight.float(), None if module.bias is None else module.bias.float())
        else:
            y = F.linear(x2.to(torch.bfloat16), module.weight, module.bias)
    else:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x2.to(torch.bfloat16).contiguous(),  # the kernel takes contiguous rows only
            module._hf_spec_int4, module._hf_spec_int4_group, module._hf_spec_int4_scales)
        if module.bias is not None:
            y = y + module.bias
    return y.reshape(*rows, -1).to(x.dtype)


def quantize_draft_int4(model: torch.nn.Module, group_size: int = 32) -> int:
    """Make a bfloat16 *draft* model on the CPU cheaper per drafted token, in place: each ``nn.Linear`` with
    bfloat16 weights (the vocabulary projection included; a tied one stays tied) gets a 4-bit copy of its weight
    (weight-only, asymmetric, one bfloat16 scale and offset per ``group_size`` input channels), which inputs of at
    most :data:`INT4_MAX_ROWS` (16) rows in all (batch x positions: drafting) multiply with torch's CPU int4 kernel
    (``torch.ops.aten._weight_int4pack_mm_for_cpu``, the kernel under torchao's int4 weight-only CPU layout), in
    bfloat16 activations. Larger inputs (the prompt prefill, a batch of more rows) use the bfloat16 weight, where
    that kernel is slower than a bfloat16 GEMM. So the model holds both: the int4 copies (0.625 bytes a weight
    with their scales) add ~31% to its bfloat16 size, and a drafted token reads ~31% of the bfloat16 bytes.

    Measured on Qwen2.5-Coder-0.5B (2026-12-02, 2-core EPYC with AVX512-BF16; docs/benchmarks.md): a one-token
    forward 32 ms against 58 ms for :func:`quantize_draft_int8`'s draft and 106 ms in bfloat16; the top-1
    token agreed with the bfloat16 draft's at 80% of Spec-Bench prompt positions (int8: 82%). That offline
    checkpoint was dequantized from 4-bit k-quants (groups of 32 with a scale and a minimum), a grid this format
    nearly holds: a checkpoint trained in bfloat16 may lose more agreement to the rounding. Activations stay
    bfloat16: the kernel's float32 path was ~29x slower here.

    The packed weights are plain attributes of the modules, in a layout that depends on the CPU's vector
    instructions: not in ``state_dict``, not moved by ``.to()``. Quantize after loading, on the machine that
    drafts; a changed ``weight`` is not seen by the int4 path until the model is loaded and quantized again.

    A draft's rounding cannot change the output: the target verifies every drafted token, so a less accurate
    draft only lowers acceptance. Never used on targets.

    Args:
        model: a model on the CPU whose linear layers are bfloat16 (other parameters may be float32, e.g. the
            modules a model keeps in float32).
        group_size: input channels per scale: 32, 64, 128 or 256 (:data:`INT4_GROUP_SIZES`).

    Returns:
        The number of linear layers given int4 weights (at least one). A layer whose output features are not a
        multiple of 16 or whose input features are not a multiple of ``group_size`` (the kernel's layout), or
        whose weight is not bfloat16, keeps its weight and forward.

    Raises:
        ValueError: a model that is int4 or int8 already, not on the CPU (the kernel is CPU-only; on a GPU use a
            bfloat16 draft), without any bfloat16 linear layer the kernel can take (load the draft in bfloat16,
            or use ``--draft-dtype int8`` / ``bfloat16``), or a group size the kernel does not take.
    """
    from .device import cpu_has_native_bf16

    if group_size not in INT4_GROUP_SIZES:
        raise ValueError(f"group_size must be one of {INT4_GROUP_SIZES} (torch's CPU int4 kernel), got {group_size!r}")
    if is_int4_draft(model) or is_int8_draft(model):
        raise ValueError("this draft model is quantized already (quantize_draft_int4 or quantize_draft_int8 was "
                         "called on it): use it as it is, or load it again")
    if any(p.device.type != "cpu" for p in model.parameters()):
        raise ValueError("an int4 draft runs on the CPU (torch's int4 kernel used here is CPU-only): keep the draft "
                         "on the CPU, or use a bfloat16 draft on a GPU")
    modules = [m for m in model.modules()
               if type(m) is torch.nn.Linear and not hasattr(m, "_hf_hook") and not hasattr(m, "_hf_spec_forward")
               and m.weight.dtype == torch.bfloat16 and m.out_features % 16 == 0 and m.in_features % group_size == 0]
    if not modules:
        raise ValueError(f"no linear layer of this model can take int4 weights: torch's CPU int4 kernel needs "
                         f"bfloat16 nn.Linear weights with output features a multiple of 16 and input features a "
                         f"multiple of group_size={group_size}; load the draft in bfloat16, or use --draft-dtype "
                         f"int8 or bfloat16")
    upcast = not cpu_has_native_bf16()
    for module in modules:
        module._hf_spec_int4, module._hf_spec_int4_scales = _int4_pack(module.weight, group_size)
        module._hf_spec_int4_group, module._hf_spec_int4_upcast = group_size, upcast
    return _route_modules(modules, _int4_forward)


def is_int4_draft(model: torch.nn.Module) -> bool:
    """Whether :func:`quantize_draft_int4` gave ``model``'s linear layers int4 weights."""
    return any(hasattr(m, "_hf_spec_int4") for m in model.modules())


def draft_kind(model: torch.nn.Module) -> str:
    """The draft dtype a model was made with, as ``--draft-dtype`` names it: ``"int8"``, ``"int4"``, or its
    parameters' dtype (``"bfloat16"``, ``"float32"``, ...), for reports."""
    if is_int8_draft(model):
        return "int8"
    if is_int4_draft(model):
        return "int4"
    return str(next(model.parameters()).dtype).replace("torch.", "")
