"""A faster linear layer for verify forwards of a few positions on the CPU (float32).

Verifying k+1 drafted positions should cost about one decode step: decoding is bound by reading the
weights, and k+1 rows read them once. On CPUs without native bfloat16 (AVX2), PyTorch's float32
``F.linear`` (``x @ W.T``) for 2..16 rows does not behave that way: on the 2-core machine this project is
developed on, one Qwen2.5-Coder-1.5B forward over 2 positions took 2.1x a one-position forward, over 4
positions 3.6x. Computing the same product as ``(W @ x.T).T`` reads the weight matrix once for all rows
(1.6x for 4 positions, measured side by side; see docs/benchmarks.md).

:func:`verify_linear` switches plain ``torch.nn.Linear`` modules of a model to that form *only* inside a
``with`` block, and only for float32 CPU inputs of 2..128 rows (a batch's verify forward has B x (k+1)); everywhere else (plain decoding, prefill,
other devices, quantized or hooked linear layers) the module runs its own ``forward``. The result is the
same product with another summation order: float32 rounding differences (~1e-6 relative), which the
greedy exactness tests bound as near-ties.
"""

from __future__ import annotations

import contextlib
import functools
import threading

import torch
import torch.nn.functional as F

__all__ = ["verify_linear", "install_verify_linear", "install_upcast_prefill", "NEAR_TIE_BOUNDS"]

#: Largest top-1/top-2 logit gap at which a greedy speculative output may first differ from plain decoding by
#: rounding alone (a near-tie), by compute: a verify forward over k+1 positions rounds differently from k+1
#: one-position forwards. Measured verify-vs-decode logit differences (docs/user-guide.md, "Verify forwards and
#: 4-bit kernels"): ~5e-5 in float32 (and NF4 with float32 compute); a few bfloat16 steps of 0.125-0.25 at
#: logits of 16-32; 0.33 / 0.69 for gptqmodel's CPU AWQ layers, which compute in bfloat16 inside.
#: The greedy exactness tests use these bounds.
NEAR_TIE_BOUNDS = {"float32": 1e-3, "bfloat16": 0.5, "awq": 1.0}

_STATE = threading.local()
#: up to 128 rows (a batch of 16 verifying 8 positions each): (W @ x.T).T measured as fast or faster than
#: F.linear for 2..128 rows on Qwen2.5-1.5B's shapes here (e.g. 32 rows x 1536 -> 8960: 15 ms against 24 ms)
_MIN_ROWS, _MAX_ROWS = 2, 128
#: only weights of at least this many elements are routed: smaller ones stay in the CPU caches, where
#: F.linear is as fast or faster (measured on SmolLM2's 576x576 projections)
_MIN_WEIGHT = 1 << 20
_UPCAST_MIN_ROWS = 48


def _forward(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if getattr(_STATE, "active", False) and x.dtype == torch.float32 and x.device.type == "cpu":
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if _MIN_ROWS <= rows <= _MAX_ROWS:
            y = torch.mm(module.weight, x.reshape(rows, x.shape[-1]).t()).t()
            y = y.reshape(*x.shape[:-1], module.out_features)
            return y if module.bias is None else y + module.bias
    return F.linear(x, module.weight, module.bias)


def install_verify_linear(model: torch.nn.Module) -> int:
    """Route the model's plain ``nn.Linear`` modules of at least 2^20 weights through the verify-aware
    forward (idempotent).

    Subclasses of ``nn.Linear`` (bitsandbytes, AWQ/GPTQ kernels) and modules with accelerate hooks keep
    their own forward. Outside :func:`verify_linear` the routed forward is exactly ``F.linear``.

    Returns:
        The number of modules routed.
    """
    return _route(model, _forward, _MIN_WEIGHT)


def _route(model: torch.nn.Module, forward, min_weight: int = 0) -> int:
    """Point every plain ``nn.Linear`` of ``model`` (no subclass, no accelerate hook, at least
    ``min_weight`` weight elements) at ``forward``."""
    count = 0
    for module in model.modules():
        if (type(module) is torch.nn.Linear and not hasattr(module, "_hf_hook")
                and module.weight.numel() >= min_weight):
            if getattr(module, "_hf_spec_forward", None) is not forward:
                # a partial of a module-level function, not a bound method: the model still pickles and deep-copies
                # (pickle rebuilds a bound method by looking its function's name up on the module, which fails)
                module.forward = functools.partial(forward, module)
                module._hf_spec_forward = forward
            count += 1
    return count


@contextlib.contextmanager
def verify_linear(enabled: bool = True):
    """Inside the block, routed linear layers use ``(W @ x.T).T`` for 2..128 float32 CPU rows."""
    previous = getattr(_STATE, "active", False)
    _STATE.active = enabled
    try:
        yield
    finally:
        _STATE.active = previous


def _upcast_forward(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if rows >= _UPCAST_MIN_ROWS and x.device.type == "cpu" and x.dtype in (torch.bfloat16, torch.float16):
        bias = None if module.bias is None else module.bias.float()
        return F.linear(x.float(), module.weight.float(), bias).to(x.dtype)
    return F.linear(x, module.weight, module.bias)


def install_upcast_prefill(model: torch.nn.Module) -> int:
    """For a *draft* model in bfloat16/float16 on a CPU without native bfloat16: compute linear layers over
    48 rows or more (the prompt prefill) in float32. Emulated bfloat16 GEMMs are ~3x slower than upcasting
    the weights and using float32 ones there; one-row decode steps stay in bfloat16, which halves the bytes
    read per drafted token. Never used on targets (it changes their rounding); a draft's rounding does not
    affect exactness, which verification guarantees. Idempotent.

    Returns:
        The number of modules routed.
    """
    return _route(model, _upcast_forward)
