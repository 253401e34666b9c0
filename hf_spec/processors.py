"""Applying ``transformers`` logits processors to a batch whose rows have different lengths.

Warpers that look only at the scores (temperature, top-k, top-p, min-p, typical, epsilon, eta) run once
on the whole batch. Any other processor (repetition penalty, min new tokens, no-repeat n-gram, ...) may
read the sequence, so it runs row by row on that row's own sequence; the score-only warpers after the last such
processor still run once on all rows (a sampled verify step's top-k and top-p: one call over every position).
Processors that ``generate`` built for the whole batch keep per-row state (a repetition penalty's
``prompt_ignore_length`` per row, the encoder penalties' prompt ids, ``prefix_allowed_tokens_fn``'s ``batch_id``):
:func:`row_processors` gives each row its own view of them, so row b is processed exactly as transformers' batched
``generate`` processes it.
"""

from __future__ import annotations

import copy

import torch
from transformers import LogitsProcessorList
from transformers.generation.logits_process import (
    EncoderNoRepeatNGramLogitsProcessor,
    EncoderRepetitionPenaltyLogitsProcessor,
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    MinPLogitsWarper,
    PrefixConstrainedLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

__all__ = ["process_scores", "reads_sequences", "row_processors"]

_SCORES_ONLY = (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, MinPLogitsWarper,
                TypicalLogitsWarper, EpsilonLogitsWarper, EtaLogitsWarper)


def reads_sequences(processors: LogitsProcessorList) -> bool:
    """Whether any processor may look at the token sequence (not only at the scores)."""
    return any(type(p) not in _SCORES_ONLY for p in processors)


def _row_view(processor, b: int, padded: bool):
    """``processor`` as it applies to batch row b alone (itself when it keeps no per-row state)."""
    if isinstance(processor, RepetitionPenaltyLogitsProcessor) and isinstance(processor.prompt_ignore_length,
                                                                             torch.Tensor):
        view = copy.copy(processor)  # generate set it to each row's left padding, which unpadded rows lack
        view.prompt_ignore_length = processor.prompt_ignore_length[b:b + 1] if padded else None
        return view
    if isinstance(processor, EncoderRepetitionPenaltyLogitsProcessor):
        view = copy.copy(processor)
        view.encoder_input_ids = processor.encoder_input_ids[b:b + 1]
        return view
    if isinstance(processor, EncoderNoRepeatNGramLogitsProcessor):
        view = copy.copy(processor)
        view.batch_size, view.generated_ngrams = 1, processor.generated_ngrams[b:b + 1]
        return view
    if isinstance(processor, PrefixConstrainedLogitsProcessor):
        # generate builds it for rows in groups of max(num_beams, num_return_sequences) and passes the group's index
        # as batch_id (the prompt's); the view takes one row at a time and passes that prompt's index
        view = copy.copy(processor)
        allowed, group = processor._prefix_allowed_tokens_fn, processor._num_beams
        view._prefix_allowed_tokens_fn = lambda _batch_id, sent: allowed(b // group, sent)
        view._num_beams = 1
        return view
    return processor


def row_processors(processors: LogitsProcessorList, batch_size: int, padded: bool = True) -> list[LogitsProcessorList]:
    """Per-row views of a batch's logits processors, for rows processed one at a time.

    Args:
        processors: the processors ``generate`` built for a batch of ``batch_size`` rows.
        batch_size: B.
        padded: whether the rows will be given with their left padding (the target's, as ``generate`` sees
            them); ``False`` for rows without it (drafters): a repetition penalty then ignores no prompt
            tokens, since the padding it was told to skip is not there.

    Returns:
        B ``LogitsProcessorList`` s, row b's processors with their per-row state narrowed to row b (a
        repetition penalty's ``prompt_ignore_length``, encoder penalties' prompt ids, the ``batch_id`` passed to
        ``prefix_allowed_tokens_fn``); processors without per-row state are shared.
    """
    if batch_size == 1 and padded:
        return [processors]
    return [LogitsProcessorList(_row_view(p, b, padded) for p in processors) for b in range(batch_size)]


def process_scores(processors: LogitsProcessorList | list[LogitsProcessorList], sequences: list[torch.LongTensor] | None,
                   scores: torch.Tensor) -> torch.Tensor:
    """Apply ``processors`` to next-token scores.

    Args:
        processors: a ``LogitsProcessorList`` (may be empty), or one per row of ``sequences``
            (:func:`row_processors`; the same processor types in the same order in each).
        sequences: N ``LongTensor[L_n]``, the tokens before each scored position; may be ``None`` when no
            processor reads them (:func:`reads_sequences` is False).
        scores: ``Tensor[N, V]``, raw next-token logits (N rows, or rows x positions flattened).

    Returns:
        ``Tensor[N, V]``, processed scores.

    Raises:
        ValueError: ``sequences`` is ``None`` but a processor reads them.
    """
    per_row = isinstance(processors, list) and not isinstance(processors, LogitsProcessorList)
    shared = processors[0] if per_row else processors
    if len(shared) == 0:
        return scores
    if not reads_sequences(shared):  # one call for every row and position
        return shared(scores.new_zeros((scores.shape[0], 1), dtype=torch.long), scores)
    if sequences is None:
        raise ValueError("these logits processors read the sequence: pass the sequences")
    if len(sequences) == 1:
        return (processors[0] if per_row else processors)(sequences[0][None], scores)
    # row by row up to the last processor that reads the sequence, then the score-only rest on all rows at once
    # (the same operations in the same order: each of those warpers treats every row by itself)
    split = 1 + max(i for i, p in enumerate(shared) if type(p) not in _SCORES_ONLY)
    lists = processors if per_row else [processors] * len(sequences)
    heads = {id(p): LogitsProcessorList(list(p)[:split]) for p in lists}
    scores = torch.cat([heads[id(lists[b])](s[None], scores[b: b + 1]) for b, s in enumerate(sequences)])
    tail = LogitsProcessorList(list(shared)[split:])
    return tail(scores.new_zeros((scores.shape[0], 1), dtype=torch.long), scores) if len(tail) else scores
