"""Drafters: one file each, all ``transformers`` ``CandidateGenerator`` subclasses."""

from .base import Drafter
from .draft_model import DraftModelDrafter, VocabularyMismatchError
from .medusa import MedusaDrafter
from .ngram import NgramDrafter

__all__ = ["Drafter", "DraftModelDrafter", "MedusaDrafter", "NgramDrafter", "VocabularyMismatchError"]
