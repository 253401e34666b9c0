"""4-bit targets: bitsandbytes quantization at load time, and what a checkpoint's own quantization is.

``hf_spec.load(..., quantization="nf4")`` quantizes a target's weights while loading (QLoRA's NF4 or FP4,
through transformers' ``BitsAndBytesConfig``); an AWQ or GPTQ checkpoint loads as it is
(:func:`quantization_method` tells which it is). Making an AWQ checkpoint is :mod:`hf_spec.quantize`.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

__all__ = ["QUANTIZATIONS", "quantization_method", "bitsandbytes_config", "honor_bitsandbytes_compute_dtype",
           "bitsandbytes_bf16_layers"]

#: ``quantization=`` values of :func:`load`: bitsandbytes 4-bit weight types (quantized while loading)
QUANTIZATIONS = ("nf4", "fp4")


def quantization_method(path: str | Path) -> str | None:
    """The ``quant_method`` of a model folder's ``config.json`` (``"awq"``, ``"gptq"``, ``"bitsandbytes"``...),
    or ``None`` for an unquantized model or a path without a config (a hub name)."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return None
    quantization = json.loads(config.read_text()).get("quantization_config")
    return None if quantization is None else str(quantization.get("quant_method", "unknown"))


def bitsandbytes_config(quantization: str, dtype=None):
    """A ``transformers.BitsAndBytesConfig`` for 4-bit weights of type ``quantization`` (``"nf4"`` or
    ``"fp4"``; Dettmers et al. 2023, QLoRA) computing in ``dtype`` (default float32).

    Raises:
        ValueError: an unknown quantization.
        ImportError: bitsandbytes is not installed (with the command that installs it).
    """
    import torch
    from transformers import BitsAndBytesConfig

    if quantization not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {quantization!r}; use one of {', '.join(QUANTIZATIONS)} "
                         "(AWQ and GPTQ checkpoints load as they are: pass their folder as the model)")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ImportError(f"quantization={quantization!r} needs bitsandbytes: pip install 'hf-spec[bitsandbytes]'")
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=quantization,
                              bnb_4bit_compute_dtype=dtype if dtype is not None else torch.float32)


def honor_bitsandbytes_compute_dtype(model) -> int:
    """Make bitsandbytes' 4-bit layers compute in their own compute dtype on CPUs with AVX512-BF16.

    On such CPUs bitsandbytes (0.50; checked on 0.50.2) runs every CPU 4-bit product through a fused kernel that casts the
    input to bfloat16 and computes in bfloat16, whatever ``bnb_4bit_compute_dtype`` says. A model asked to
    compute in float32 then rounds each 4-bit layer's input and output to bfloat16, and a verify forward over
    k+1 positions, whose float32 parts (attention over k+1 queries) round differently from k+1 one-position
    forwards, crosses bfloat16 rounding boundaries: on SmolLM2-135M NF4 the verify-vs-decode logit
    difference grew from 3e-5 to 0.27-0.36 (2026-11-30), and greedy output was no longer token-identical.
    This switches the fused kernel off for layers whose compute dtype is not bfloat16, so bitsandbytes
    dequantizes and computes in the asked dtype, as it does on other CPUs. It costs plain decoding speed
    (SmolLM2 NF4: 9.4 instead of 27.7 tokens/s on a 2-core AVX512-BF16 VM); ask for bfloat16 compute to keep
    the fused kernel. :func:`load` calls it for ``quantization=``; call it on a 4-bit model loaded
    otherwise, before its first forward. No effect without bitsandbytes, or on a GPU (the flag it clears
    only selects a CPU kernel).

    Returns:
        The number of 4-bit layers switched.

    Raises:
        ValueError: a layer already ran its first CPU forward (its weights were repacked for the fused
            kernel); call this right after loading.
    """
    count = 0
    for module in bitsandbytes_bf16_layers(model):
        state = getattr(module.weight, "quant_state", None)
        if getattr(state, "packing_format_for_cpu", False):
            raise ValueError("a bitsandbytes 4-bit layer already ran a forward in bitsandbytes' fused bfloat16 "
                             "format; call honor_bitsandbytes_compute_dtype(model) right after loading")
        module.support_avx512bf16_for_cpu = False
        count += 1
    return count


def bitsandbytes_bf16_layers(model) -> list:
    """bitsandbytes 4-bit layers of ``model`` that will compute in bfloat16 although their compute dtype is
    not bfloat16 (the fused CPU kernel; see :func:`honor_bitsandbytes_compute_dtype`)."""
    import torch

    return [m for m in model.modules() if getattr(m, "support_avx512bf16_for_cpu", False)
            and getattr(m, "compute_dtype", None) != torch.bfloat16]
