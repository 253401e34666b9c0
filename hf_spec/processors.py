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

__all__ = ["process_scores", "reads_sequences"]

_SCORES_ONLY = (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, MinPLogitsWarper,
                TypicalLogitsWarper, EpsilonLogitsWarper, EtaLogitsWarper)


def reads_sequences(processors: LogitsProcessorList) -> bool:
    """Whether any processor may look at the token sequence (not only at the scores)."""
    return any(type(p) not in _SCORES_ONLY for p in processors)


def process_scores(processors: LogitsProcessorList, sequences: list[torch.LongTensor] | None, scores: torch.Tensor) -> torch.Tensor:
    """Apply ``processors`` to next-token scores.

    Args:
        processors: a ``LogitsProcessorList`` (may be empty).
        sequences: N ``LongTensor[L_n]``, the tokens before each scored position; may be ``None`` when no
            processor reads them (:func:`reads_sequences` is False).
        scores: ``Tensor[N, V]``, raw next-token logits (N rows, or rows x positions flattened).

    Returns:
        ``Tensor[N, V]``, processed scores.

    Raises:
        ValueError: ``sequences`` is ``None`` but a processor reads them.
    """
    if len(processors) == 0:
        return scores
    if not reads_sequences(processors):  # one call for every row and position
        return processors(scores.new_zeros((scores.shape[0], 1), dtype=torch.long), scores)
    if sequences is None:
        raise ValueError("these logits processors read the sequence: pass the sequences")
    return torch.cat([processors(s[None], scores[b: b + 1]) for b, s in enumerate(sequences)])
