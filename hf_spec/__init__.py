"""hf-spec: exact speculative decoding for Hugging Face transformers.

Public names only; see the user guide in ``docs/``.
"""

from ._import_noise import install as _quiet_known_import_noise

_quiet_known_import_noise()  # before anything imports transformers' quantizers (and with them torchao)

from .acceptance import greedy_accept, speculative_sample
from .adaptive import AdaptiveK, TreeSize
from .assisted import disable_drafters, enable_drafters
from .drafters import (Drafter, DraftModelDrafter, MedusaDrafter, NgramDrafter, SuffixDrafter, HybridDrafter, VerifyOutput, VocabularyMismatchError,
                       make_drafter, register_drafter)
from .medusa import MedusaCheckpointError, MedusaConfig, MedusaHeads
from .events import StepEvent
from .loop import SpeculativeOutput, generate, speculative_decode
from .metrics import SpecStats
from .prometheus import PrometheusMetrics
from .tuning import best_k, expected_speedup
from . import prompts
from .models import ModelChecksumError, ProvisioningError, UnknownModelError, load, provision

__all__ = [
    "Drafter", "DraftModelDrafter", "NgramDrafter", "SuffixDrafter", "HybridDrafter", "MedusaDrafter", "MedusaHeads", "MedusaConfig", "VerifyOutput",
    "make_drafter", "register_drafter", "prompts",
    "MedusaCheckpointError", "VocabularyMismatchError",
    "greedy_accept", "speculative_sample", "generate", "speculative_decode", "SpeculativeOutput",
    "enable_drafters", "disable_drafters", "StepEvent", "SpecStats", "AdaptiveK", "TreeSize", "PrometheusMetrics", "expected_speedup", "best_k",
    "load", "provision", "ModelChecksumError", "ProvisioningError", "UnknownModelError",
]
__version__ = "0.1.0"
