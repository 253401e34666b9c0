"""Log filters for two known, harmless messages that other packages log while they are imported.

transformers imports torchao, when it is installed (gptqmodel, in the test and quantization extras, pulls it
in), the first time a model loads (``transformers.quantizers`` probes every quantization backend). On that
import torchao logs:

- ``Failed to load .../torchao/_C_mxfp8...so: Could not load this library`` (and ``_C_cutlass_90a``): its CUDA
  kernels, which link ``libtorch_cuda``, cannot load into a CPU-only build of torch. Dropped only when torch is
  a CPU-only build (``torch.version.cuda is None``); with a CUDA build the same message is a real failure and
  stays.
- ``<enum 'KernelPreference'> is an Enum subclass and is now natively supported by torch.compile ...
  register_constant() on Enum subclasses is deprecated``, logged by ``torch.utils._pytree`` because torchao
  registers its enums the old way. Dropped only for enums defined in torchao; the same warning about any other
  package's enum stays.

The filters sit on those two loggers only and match those messages only; hf-spec never uses torchao. They
are installed when :mod:`hf_spec` is imported, before anything imports transformers' quantizers.
"""

from __future__ import annotations

import logging

__all__ = ["install"]

_PYTREE_ENUM = "%s is an Enum subclass and is now natively supported by torch.compile"


def _torch_is_cpu_only() -> bool:
    import sys

    torch = sys.modules.get("torch")  # torchao imports torch before it logs
    return torch is not None and getattr(torch.version, "cuda", None) is None


def _torchao_cuda_kernels_on_cpu_torch(record: logging.LogRecord) -> bool:
    """False (drop) for torchao's failure to load its CUDA kernel libraries into a CPU-only torch."""
    message = record.getMessage()
    is_kernel_library = message.startswith("Failed to load ") and "/torchao/_C" in message and ".so" in message
    return not (is_kernel_library and record.levelno == logging.WARNING and _torch_is_cpu_only())


def _torchao_enum_registration(record: logging.LogRecord) -> bool:
    """False (drop) for torch's deprecation warning about torchao registering its enums as pytree constants."""
    if not (isinstance(record.msg, str) and record.msg.startswith(_PYTREE_ENUM) and record.args):
        return True
    cls = record.args[0] if isinstance(record.args, tuple) else None
    return not str(getattr(cls, "__module__", "")).startswith("torchao")


def install() -> None:
    """Add the two filters (once; a second call changes nothing)."""
    for name, check in (("torchao", _torchao_cuda_kernels_on_cpu_torch),
                        ("torch.utils._pytree", _torchao_enum_registration)):
        logger = logging.getLogger(name)
        if check not in logger.filters:
            logger.addFilter(check)
