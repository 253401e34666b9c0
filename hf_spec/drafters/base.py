"""The drafter interface: a ``transformers`` ``CandidateGenerator`` that proposes up to k tokens.

The decoding loop (:mod:`hf_spec.loop`) uses only the ``CandidateGenerator`` contract
(``get_candidates`` / ``update_candidate_strategy``) plus :meth:`Drafter.prepare`, which binds a drafter
to one generate call. A drafter knows nothing about verification.
"""

from __future__ import annotations

import torch
from transformers import GenerationConfig, LogitsProcessorList
from transformers.generation import CandidateGenerator

from ..processors import process_scores

__all__ = ["Drafter", "check_num_speculative_tokens"]


def check_num_speculative_tokens(k) -> int:
    """Validate k (``num_speculative_tokens``): an int >= 1.

    Raises:
        ValueError: k is not an integer >= 1.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(
            f"num_speculative_tokens must be an integer >= 1 or \"auto\", got {k!r}; use 1..12 (5 is a good "
            "start), \"auto\" to let hf-spec choose per step, or drafter=None to decode without speculation"
        )
    return k


class Drafter(CandidateGenerator):
    """Base class of hf-spec's drafters.

    Args:
        num_speculative_tokens: k, the most tokens proposed per step (>= 1). The loop may lower it for a
            step (near ``max_new_tokens``) or change it between steps (adaptive k) by setting the attribute.

    Raises:
        ValueError: ``num_speculative_tokens`` < 1.

    Subclasses implement :meth:`draft` (a batch of rows of different lengths) and, when they keep per-row
    state, :meth:`select_rows`; ``get_candidates`` wraps :meth:`draft` in the ``CandidateGenerator``
    contract for one row.
    """

    #: short name used in statistics and metric labels
    method: str = "drafter"
    #: True when the drafter samples its tokens and returns the distributions (scores) it sampled from
    returns_scores: bool = False
    #: the most tokens the drafter can propose per step (``None``: no limit); bounds adaptive k
    max_num_speculative_tokens: int | None = None

    def __init__(self, num_speculative_tokens: int = 5):
        self.num_speculative_tokens = check_num_speculative_tokens(num_speculative_tokens)
        self.generation_config: GenerationConfig | None = None
        self.logits_processor = LogitsProcessorList()
        self.max_length: int | None = None

    # ---- binding to one generate call -----------------------------------------------------------
    def prepare(
        self,
        target,
        input_ids: torch.LongTensor,
        generation_config: GenerationConfig,
        logits_processor: LogitsProcessorList | None = None,
    ) -> None:
        """Bind to one generate call: check compatibility with ``target`` and reset per-call state.

        Args:
            target: the target ``PreTrainedModel``.
            input_ids: ``LongTensor[B, L]``, the prompt.
            generation_config: the call's prepared generation config (``do_sample``, ``max_length``).
            logits_processor: the call's logits processors (temperature, top-k, top-p, penalties, ...).

        Raises:
            ValueError: the drafter cannot serve this target (e.g. vocabulary mismatch).
        """
        self.generation_config = generation_config
        self.logits_processor = logits_processor if logits_processor is not None else LogitsProcessorList()
        self.max_length = generation_config.max_length

    def budget(self, input_ids: torch.LongTensor) -> int:
        """How many tokens to draft now: k, capped so that the verified run cannot pass ``max_length``."""
        k = self.num_speculative_tokens
        if self.max_length is not None:
            k = min(k, self.max_length - input_ids.shape[1] - 1)
        return max(k, 0)

    # ---- what the loop calls --------------------------------------------------------------------
    def draft(
        self, sequences: list[torch.LongTensor], k: int
    ) -> tuple[torch.LongTensor, torch.LongTensor, torch.Tensor | None]:
        """Propose up to k tokens after each row's sequence.

        Args:
            sequences: B ``LongTensor[L_b]``, each row's tokens so far (prompt without padding, then the
                generated tokens); rows may differ in length.
            k: the most tokens to propose per row (>= 1).

        Returns:
            ``(tokens, num_drafted, scores)``: ``LongTensor[B, k']`` (``k' <= k``; row b's columns from
            ``num_drafted[b]`` on are filler), ``LongTensor[B]``, and for a drafter that samples, the
            processed logits ``Tensor[B, k', V]`` each token was drawn from (``None`` for a deterministic one).
        """
        raise NotImplementedError

    def choose(self, sequences: list[torch.LongTensor], logits: torch.Tensor) -> tuple[torch.LongTensor, torch.Tensor]:
        """Pick each row's drafted token the way the target picks its own: the call's logits processors on
        ``logits [B, V]`` (row b's prefix is ``sequences[b]``), then argmax (greedy) or a sample.

        Returns:
            ``(token LongTensor[B], processed scores [B, V])``; the scores are q under sampling.
        """
        processed = process_scores(self.logits_processor, sequences, logits)
        if self.generation_config is not None and self.generation_config.do_sample:
            return torch.multinomial(processed.softmax(dim=-1), 1).squeeze(1), processed
        return processed.argmax(dim=-1), processed

    def select_rows(self, rows: torch.LongTensor) -> None:
        """Keep only these batch rows (indices into the current batch): the loop dropped finished ones."""

    # ---- the transformers CandidateGenerator contract (batch size 1) ---------------------------
    def get_candidates(self, input_ids: torch.LongTensor, **kwargs) -> tuple[torch.LongTensor, torch.Tensor | None]:
        """``(candidate_ids LongTensor[1, L + k'], candidate_scores Tensor[1, k', V] or None)``."""
        k = self.budget(input_ids)
        if k == 0:
            return input_ids, None
        tokens, num_drafted, scores = self.draft(list(input_ids), k)
        width = int(num_drafted.min())
        if width == 0:
            return input_ids, None
        scores = scores[:, :width] if scores is not None else None
        return torch.cat([input_ids, tokens[:, :width].to(input_ids.device)], dim=1), scores

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches) -> None:
        """Called by transformers' assisted loop after each verification (hf-spec's loop does not)."""
