"""What this machine computes fast: CPU features, the compute dtype, the draft dtype, and a machine record.

Kept apart from model provisioning (:mod:`hf_spec.models`): the loop, the drafters, the benchmark and the
commands all ask these questions, and none of them needs the GGUF machinery to do so.
"""

from __future__ import annotations

import functools
import platform
import subprocess
from datetime import date
from pathlib import Path

__all__ = ["cpu_flags", "cpu_has_native_bf16", "resolve_dtype", "draft_dtype", "machine_info"]

#: the CPU features that decide which dtype and which kernels pay here (reported beside every measurement)
_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


@functools.lru_cache(maxsize=1)
def cpu_flags() -> tuple[str, ...]:
    """The CPU features among avx2, avx512f, avx512_bf16, amx_bf16 and amx_tile that this CPU has, from
    ``/proc/cpuinfo`` (empty where it cannot be read)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="ignore")
    except OSError:
        return ()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    have = set(line.split(":", 1)[-1].split())
    return tuple(f for f in _FLAGS if f in have)


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX512-BF16 or AMX-BF16)."""
    return bool({"avx512_bf16", "amx_bf16"} & set(cpu_flags()))


def resolve_dtype(name: str | None = "auto"):
    """The compute dtype for ``name``; ``"auto"`` picks the fastest that is sound here.

    ``auto``: bfloat16 on a CUDA GPU that supports it (else float16); on a CPU, bfloat16 when the CPU has
    native bfloat16 instructions (there it runs ~2.5x faster than float32 and verification is nearly flat),
    else float32 (on AVX2-only CPUs bfloat16 is emulated: prefill is ~4x slower than float32).

    Raises:
        ValueError: an unknown dtype name.
    """
    import torch

    if isinstance(name, torch.dtype):
        return name
    if name in (None, "auto"):
        if torch.cuda.is_available():
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.bfloat16 if cpu_has_native_bf16() else torch.float32
    if name not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"unknown dtype {name!r}; use auto, float32, bfloat16 or float16")
    return getattr(torch, name)


def draft_dtype(target_dtype, name: str | None = "auto"):
    """The dtype of a draft model beside a target of ``target_dtype``.

    ``auto``: float16 beside a float16 target, else bfloat16: a draft's rounding cannot change the output
    (verification decides every token), and half the bytes make each drafted token cheaper. Any other name
    goes through :func:`resolve_dtype`.

    Raises:
        ValueError: an unknown dtype name.
    """
    import torch

    if name in (None, "auto"):
        return torch.float16 if target_dtype == torch.float16 else torch.bfloat16
    return resolve_dtype(name)


def machine_info() -> dict:
    """Date, commit, CPU model and features, threads, and library versions: the record beside a measurement."""
    import torch
    import transformers

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent).stdout.strip() or "?"
    except OSError:
        commit = "?"
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"date": str(date.today()), "commit": commit, "machine": cpu, "cpu_flags": list(cpu_flags()),
            "threads": torch.get_num_threads(), "torch": torch.__version__, "transformers": transformers.__version__}
