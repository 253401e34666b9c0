"""Drafters: one file each (a :class:`~hf_spec.drafters.base.Drafter` subclass), one registry of specs."""

from .base import DEFAULT_NUM_SPECULATIVE_TOKENS, Drafter, VerifyOutput
from .draft_model import DraftModelDrafter, VocabularyMismatchError
from .hybrid import HybridDrafter
from .medusa import MedusaDrafter
from .ngram import NgramDrafter
from .suffix import SuffixDrafter
from .registry import make_drafter, parse_drafter, register_drafter

__all__ = ["Drafter", "VerifyOutput", "DraftModelDrafter", "MedusaDrafter", "NgramDrafter", "SuffixDrafter", "HybridDrafter",
           "VocabularyMismatchError",
           "DEFAULT_NUM_SPECULATIVE_TOKENS", "make_drafter", "parse_drafter", "register_drafter"]
