"""The drafter interface: a ``transformers`` ``CandidateGenerator`` that proposes up to k tokens.

The decoding loop (:mod:`hf_spec.loop`) uses only the ``CandidateGenerator`` contract
(``get_candidates`` / ``update_candidate_strategy``) plus :meth:`Drafter.prepare`, which binds a drafter
to one generate call. A drafter knows nothing about verification.
"""

from __future__ import annotations

import torch
from transformers import GenerationConfig, LogitsProcessorList
from transformers.generation import CandidateGenerator

__all__ = ["Drafter", "check_num_speculative_tokens", "crop_cache_to"]


def check_num_speculative_tokens(k) -> int:
    """Validate k (``num_speculative_tokens``): an int >= 1.

    Raises:
        ValueError: k is not an integer >= 1.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(
            f"num_speculative_tokens must be an integer >= 1, got {k!r}; use 1..12 (5 is a good start), "
            "or drafter=None to decode without speculation"
        )
    return k


def crop_cache_to(cache, length: int) -> None:
    """Shrink a ``transformers`` cache to its first ``length`` positions (no-op when already shorter).

    ``Cache.crop(n)`` in transformers 5 takes a negative count of tokens to remove.
    """
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


class Drafter(CandidateGenerator):
    """Base class of hf-spec's drafters.

    Args:
        num_speculative_tokens: k, the most tokens proposed per step (>= 1). The loop may lower it for a
            step (near ``max_new_tokens``) or change it between steps (adaptive k) by setting the attribute.

    Raises:
        ValueError: ``num_speculative_tokens`` < 1.

    Subclasses implement :meth:`propose`; ``get_candidates`` wraps it in the ``CandidateGenerator``
    contract: ``(candidate_ids LongTensor[B, L + k'], candidate_scores Tensor[B, k', V] or None)``.
    """

    #: short name used in statistics and metric labels
    method: str = "drafter"
    #: True when the drafter samples its tokens and returns the distributions (scores) it sampled from
    returns_scores: bool = False

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

    # ---- the CandidateGenerator contract --------------------------------------------------------
    def get_candidates(self, input_ids: torch.LongTensor, **kwargs) -> tuple[torch.LongTensor, torch.Tensor | None]:
        k = self.budget(input_ids)
        if k == 0:
            return input_ids, None
        tokens, scores = self.propose(input_ids, k)
        if tokens.shape[1] == 0:
            return input_ids, None
        return torch.cat([input_ids, tokens.to(input_ids.device)], dim=1), scores

    def propose(self, input_ids: torch.LongTensor, k: int) -> tuple[torch.LongTensor, torch.Tensor | None]:
        """Propose up to k tokens after ``input_ids``.

        Args:
            input_ids: ``LongTensor[B, L]``, the sequence so far.
            k: the most tokens to propose (>= 1).

        Returns:
            ``(tokens LongTensor[B, k'], scores Tensor[B, k', V] or None)`` with ``0 <= k' <= k``; scores are the
            processed logits the tokens were sampled from (``None`` for a deterministic drafter).
        """
        raise NotImplementedError

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches) -> None:
        """Called after each verification with the new sequence and the number of accepted tokens."""
