"""Where models run and what computes fast there: CPU features, the device map, the compute dtype per device,
the draft dtype, CUDA-synchronised clocks, what else ran on the CPU during a timing, and a machine record.

Kept apart from model provisioning (:mod:`hf_spec.models`): the loop, the drafters, the benchmark and the
commands all ask these questions, and none of them needs the GGUF machinery to do so.
"""

from __future__ import annotations

import functools
import platform
import re
import subprocess
import time
from datetime import date
from pathlib import Path

__all__ = ["cpu_flags", "cpu_has_native_bf16", "cpu_has_int8_dot", "DEVICE_MAP_HELP", "resolve_device_map", "main_device", "auto_dtype",
           "resolve_dtype", "draft_dtype", "synchronize", "clock", "OtherCpu", "machine_info"]

#: the CPU features that decide which dtype and which kernels pay here (reported beside every measurement)
_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_int8", "amx_tile")


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


def cpu_has_int8_dot() -> bool:
    """Whether this CPU has int8 dot-product instructions (AVX512-VNNI, AVX-VNNI or AMX-INT8), which torch's
    dynamic int8 kernels (fbgemm) use."""
    return bool({"avx512_vnni", "avx_vnni", "amx_int8"} & set(cpu_flags()))


#: accelerate's placement strategies, accepted by ``--device-map`` as they are
_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")

#: the help text of ``--device-map`` (every command that loads a model, and the demo)
DEVICE_MAP_HELP = ("where the model's weights go: auto (accelerate places them on the GPUs, spilling to the CPU when "
                   "they do not fit), balanced, balanced_low_0, sequential, cpu, cuda or cuda:N; default: auto when "
                   "CUDA is available, else cpu. Draft models go on the target's (first) device")


def resolve_device_map(text: str | None = None) -> str:
    """The ``device_map`` for ``hf_spec.load`` that ``--device-map`` names, checked against this machine.

    Args:
        text: ``None`` (the default: ``"auto"`` when CUDA is available, else ``"cpu"``), an accelerate strategy
            (``auto``, ``balanced``, ``balanced_low_0``, ``sequential``), ``cpu``, ``cuda``, ``cuda:N`` or ``mps``.

    Raises:
        ValueError: an unknown value, or a device this machine does not have (one line, for the CLI).
    """
    import torch

    if text is None:
        return "auto" if torch.cuda.is_available() else "cpu"
    value = text.strip().lower()
    if value in _STRATEGIES or value == "cpu":
        return value
    if value == "cuda" or re.fullmatch(r"cuda:\d+", value):
        if not torch.cuda.is_available():
            raise ValueError(f"--device-map {text}: no CUDA device here (torch.cuda.is_available() is False); "
                             "use --device-map cpu")
        index = int(value.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise ValueError(f"--device-map {text}: this machine has {torch.cuda.device_count()} CUDA device(s) "
                             f"(cuda:0..cuda:{torch.cuda.device_count() - 1})")
        return value
    if value == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise ValueError(f"--device-map {text}: no MPS device here; use --device-map cpu")
        return value
    raise ValueError(f"--device-map {text!r}: use auto, balanced, balanced_low_0, sequential, cpu, cuda or cuda:N")


def main_device(device_map=None):
    """The device a model loaded with ``device_map`` computes on first (its embeddings, its inputs), as a
    ``torch.device``: an accelerate strategy (or ``None`` in the command line's sense of "the default")
    means ``cuda:0`` where CUDA is available, else the CPU; a dict's first GPU entry, else the CPU."""
    import torch

    if isinstance(device_map, torch.device):
        return device_map
    if isinstance(device_map, dict):
        for value in device_map.values():
            if isinstance(value, int) or (isinstance(value, (str, torch.device)) and str(value).startswith(("cuda", "mps"))):
                return torch.device("cuda", value) if isinstance(value, int) else torch.device(value)
        return torch.device("cpu")
    if device_map is None or device_map in _STRATEGIES:
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    return torch.device(device_map)


def auto_dtype(device="cpu", *, capability: tuple[int, int] | None = None, cpu_bf16: bool | None = None):
    """The dtype ``--dtype auto`` picks for a model on ``device``: the decision, with what it depends on
    passable, so that it can be checked without the hardware.

    * CUDA: bfloat16 on compute capability 8.0 or later (Ampere, Hopper: native bfloat16 tensor cores), else
      float16 (bfloat16 is emulated or missing on older GPUs).
    * CPU: bfloat16 when the CPU has native bfloat16 instructions (AVX512-BF16 or AMX: there it runs ~2.5x
      faster than float32 and verification is nearly flat), else float32 (on AVX2-only CPUs bfloat16 is
      emulated: prefill is ~4x slower than float32).
    * any other device (mps, xpu, ...): float32, the choice that is sound everywhere.

    Args:
        device: ``torch.device``, a device string (``"cuda:1"``) or a device map (:func:`main_device`).
        capability: the GPU's ``(major, minor)``; default: asked of the device.
        cpu_bf16: whether the CPU computes bfloat16 natively; default: :func:`cpu_has_native_bf16`.
    """
    import torch

    device = main_device(device)
    if device.type == "cuda":
        if capability is None:
            capability = torch.cuda.get_device_capability(device)
        return torch.bfloat16 if tuple(capability) >= (8, 0) else torch.float16
    if device.type == "cpu":
        return torch.bfloat16 if (cpu_has_native_bf16() if cpu_bf16 is None else cpu_bf16) else torch.float32
    return torch.float32


def resolve_dtype(name: str | None = "auto", device=None):
    """The compute dtype for ``name``; ``"auto"`` picks the fastest that is sound on the device the model goes
    to (:func:`auto_dtype`).

    Args:
        name: ``"auto"`` (or ``None``), ``"float32"``, ``"bfloat16"``, ``"float16"`` or a ``torch.dtype``.
        device: where the model goes: a ``torch.device``, a device string or a device map (``"auto"``,
            ``"cpu"``, ...); default ``None``: CUDA when available, else the CPU (the command line's default).

    Raises:
        ValueError: an unknown dtype name.
    """
    import torch

    if isinstance(name, torch.dtype):
        return name
    if name in (None, "auto"):
        return auto_dtype(main_device(device))
    if name not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"unknown dtype {name!r}; use auto, float32, bfloat16 or float16")
    return getattr(torch, name)


def draft_dtype(target_dtype, name: str | None = "auto", device=None):
    """The dtype of a draft model beside a target of ``target_dtype`` on ``device``.

    A draft's rounding cannot change the output (verification decides every token), so fewer bytes per weight
    make each drafted token cheaper at no cost in exactness, only perhaps in acceptance. ``auto``:

    - on a CPU with native bfloat16 (:func:`cpu_has_native_bf16`) beside a float32 or bfloat16 target:
      ``"int4"`` (a one-token forward of Qwen2.5-Coder-0.5B took 32 ms against int8's 58 ms and bfloat16's 106 ms
      on an AVX512-BF16 EPYC, and the draft model ran 1.10x faster than with the int8 draft per Spec-Bench prompt;
      docs/benchmarks.md);
    - on another CPU with int8 dot-product instructions (:func:`cpu_has_int8_dot`) beside a float32 or bfloat16
      target: ``"int8"`` (59 ms against bfloat16's 110 ms on an AVX512-VNNI EPYC); int4 was not measured there,
      and its kernel takes bfloat16 activations, which such CPUs emulate;
    - else float16 beside a float16 target, else bfloat16.

    ``"int8"``: the string ``"int8"``, a float32 draft whose linear layers are made int8 on the CPU
    (:func:`hf_spec.kernels.quantize_draft_int8`); ``"int4"``: the string ``"int4"``, a bfloat16 draft whose
    linear layers get 4-bit weights for drafting on the CPU (:func:`hf_spec.kernels.quantize_draft_int4`). Any
    other name goes through :func:`resolve_dtype`.

    Args:
        device: where the target computes (a ``torch.device`` or device map, :func:`main_device`); default: CUDA
            when available, else the CPU.

    Raises:
        ValueError: an unknown dtype name.
    """
    import torch

    if name in ("int8", "int4"):
        return name
    if name in (None, "auto"):
        if target_dtype != torch.float16 and main_device(device).type == "cpu":
            if cpu_has_native_bf16():
                return "int4"
            if cpu_has_int8_dot():
                return "int8"
        return torch.float16 if target_dtype == torch.float16 else torch.bfloat16
    return resolve_dtype(name)


def check_draft_dtype(name: str | None, device_map=None) -> None:
    """Refuse, before any model loads, a draft dtype the target's device cannot run: ``"int8"`` (torch's dynamic
    int8 kernels) and ``"int4"`` (torch's CPU int4 kernel) are CPU-only.

    Raises:
        ValueError: ``"int8"`` or ``"int4"`` with a target that goes to a GPU (``device_map``: a device map or a
            ``torch.device``, as :func:`main_device` reads it).
    """
    if name in ("int8", "int4") and main_device(device_map).type not in ("cpu", "meta"):
        kernels = "dynamic int8 kernels" if name == "int8" else "CPU int4 kernel"
        raise ValueError(f"--draft-dtype {name} runs on the CPU only (torch's {kernels}), and the target goes "
                         f"to {main_device(device_map)}: use --draft-dtype auto or bfloat16 there")


def synchronize(device=None) -> None:
    """Wait until the work queued on ``device`` is done, so that a clock read next measures it: on CUDA,
    ``torch.cuda.synchronize`` of every visible GPU (a model sharded with a device map computes on several);
    a no-op on the CPU, on ``None`` and on ``meta``.

    Args:
        device: a ``torch.device``, a device string, or anything with a ``.device`` (a model, a tensor).
    """
    import torch

    device = getattr(device, "device", device)
    if device is None:
        return
    if torch.device(device).type == "cuda":
        for index in range(torch.cuda.device_count()):
            torch.cuda.synchronize(index)


def clock(device=None) -> float:
    """``time.perf_counter()`` after :func:`synchronize` of ``device``: the one clock of the loop's statistics
    (TTFT, TPOT, draft and verify times), the benchmark and the cost measurements."""
    synchronize(device)
    return time.perf_counter()


class OtherCpu:
    """The CPU time the rest of the machine took while a ``with`` block ran: other processes' (the system's busy
    time, from ``psutil.cpu_times``, less this process's own, its threads and children included) and the
    hypervisor's (``steal``: time this VM's cores waited for the host). A timing made while they ran times
    them too: :func:`hf_spec.bench.contention_warning` reads these figures for ``hf-spec generate``,
    ``bench`` and ``tune``.

    Both come from the kernel's clock ticks (10 ms on Linux), so a block of well under a second is not worth
    judging alone; sum several.

    Attributes, set when the block ends:
        wall_s: the block's wall-clock seconds.
        other_s: CPU seconds other processes used during it (all cores together; >= 0).
        steal_s: CPU seconds the hypervisor withheld from this machine's cores (0 off a VM and off Linux).
    """

    wall_s = other_s = steal_s = 0.0

    def __enter__(self) -> "OtherCpu":
        import psutil

        self._process = psutil.Process()
        self._start = (time.perf_counter(), psutil.cpu_times(), self._process.cpu_times())
        return self

    def __exit__(self, *exc) -> None:
        import psutil

        t0, system0, own0 = self._start
        system1, own1 = psutil.cpu_times(), self._process.cpu_times()
        self.wall_s = time.perf_counter() - t0
        # Linux counts guest time inside user and nice; irq and softirq are CPU work too (absent elsewhere)
        busy = lambda t: sum(getattr(t, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq"))  # noqa: E731
        own = lambda t: sum(getattr(t, f, 0.0) for f in ("user", "system", "children_user", "children_system"))  # noqa: E731
        self.other_s = max(0.0, (busy(system1) - busy(system0)) - (own(own1) - own(own0)))
        self.steal_s = max(0.0, getattr(system1, "steal", 0.0) - getattr(system0, "steal", 0.0))


def machine_info() -> dict:
    """Date, commit, CPU model and features, threads, and library versions: the record beside a measurement. Take
    it when the measurement starts: the commit is the checkout's HEAD at the time of the call."""
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
