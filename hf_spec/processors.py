"""Applying ``transformers`` logits processors to a batch whose rows have different lengths.

Warpers that look only at the scores (temperature, top-k, top-p, min-p, typical, epsilon, eta) run once
on the whole batch. Any other processor (repetition penalty, min new tokens, no-repeat n-gram, ...) may
read the sequence, so it runs row by row on that row's own sequence, exactly as it would for the row alone.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessorList
from transformers.generation.logits_process import (
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

__all__ = ["process_scores"]

_SCORES_ONLY = (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, MinPLogitsWarper,
                TypicalLogitsWarper, EpsilonLogitsWarper, EtaLogitsWarper)


def process_scores(processors: LogitsProcessorList, sequences: list[torch.LongTensor], scores: torch.Tensor) -> torch.Tensor:
    """Apply ``processors`` to next-token scores.

    Args:
        processors: a ``LogitsProcessorList`` (may be empty).
        sequences: B ``LongTensor[L_b]``, the tokens before the scored position, per row.
        scores: ``Tensor[B, V]``, raw next-token logits.

    Returns:
        ``Tensor[B, V]``, processed scores.
    """
    if len(processors) == 0:
        return scores
    if len(sequences) == 1:
        return processors(sequences[0][None], scores)
    if all(type(p) in _SCORES_ONLY for p in processors):
        return processors(torch.stack([s[-1:] for s in sequences]), scores)
    return torch.cat([processors(s[None], scores[b: b + 1]) for b, s in enumerate(sequences)])
