"""hf-spec: exact speculative decoding for Hugging Face transformers.

Public names only; see the user guide in ``docs/``. They are imported on first use (:mod:`hf_spec._lazy`):
``import hf_spec`` imports neither torch nor transformers, so the command line starts in a fraction of a second.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from ._import_noise import install as _quiet_known_import_noise
from ._lazy import lazy_exports as _lazy_exports

_quiet_known_import_noise()  # before anything imports transformers' quantizers (and with them torchao)

if _TYPE_CHECKING:
    from . import prompts
    from .acceptance import greedy_accept, speculative_sample
    from .adaptive import AdaptiveK, TreeSize
    from .assisted import disable_drafters, enable_drafters
    from .drafters import (Drafter, DraftModelDrafter, HybridDrafter, MedusaDrafter, NgramDrafter, SuffixDrafter,
                           VerifyOutput, VocabularyMismatchError, make_drafter, register_drafter)
    from .events import StepEvent
    from .loop import SpeculativeOutput, generate, speculative_decode
    from .medusa import MedusaCheckpointError, MedusaConfig, MedusaHeads
    from .metrics import SpecStats
    from .models import ModelChecksumError, ProvisioningError, UnknownModelError, load, provision
    from .prometheus import PrometheusMetrics
    from .tuning import best_k, expected_speedup

#: public name -> the submodule that defines it
_EXPORTS = {
    **dict.fromkeys(["greedy_accept", "speculative_sample"], ".acceptance"),
    **dict.fromkeys(["AdaptiveK", "TreeSize"], ".adaptive"),
    **dict.fromkeys(["enable_drafters", "disable_drafters"], ".assisted"),
    **dict.fromkeys(["Drafter", "DraftModelDrafter", "MedusaDrafter", "NgramDrafter", "SuffixDrafter", "HybridDrafter",
                     "VerifyOutput", "VocabularyMismatchError", "make_drafter", "register_drafter"], ".drafters"),
    **dict.fromkeys(["MedusaCheckpointError", "MedusaConfig", "MedusaHeads"], ".medusa"),
    "StepEvent": ".events",
    **dict.fromkeys(["SpeculativeOutput", "generate", "speculative_decode"], ".loop"),
    "SpecStats": ".metrics",
    "PrometheusMetrics": ".prometheus",
    **dict.fromkeys(["best_k", "expected_speedup"], ".tuning"),
    "prompts": ".prompts",
    **dict.fromkeys(["load", "provision", "ModelChecksumError", "ProvisioningError", "UnknownModelError"], ".models"),
}

__all__ = list(_EXPORTS)
__version__ = "0.1.0"
#: the submodules the eager ``__init__`` imported before the names were lazy: reachable as attributes, as then
_SUBMODULES = frozenset({"acceptance", "adaptive", "assisted", "device", "drafters", "events", "kernels", "loop",
                         "medusa", "metrics", "models", "processors", "prometheus", "prompts", "quantization", "ragged",
                         "tuning"})
__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS, _SUBMODULES)
