"""N-gram prompt-lookup drafter: propose the tokens that followed the last occurrence of the current
suffix in the text seen so far (prompt and generated tokens). Zero model cost, pure CPU.

After Saxena 2023, "Prompt Lookup Decoding", and transformers' ``PromptLookupCandidateGenerator``; this
version tries suffix lengths n from ``max_ngram`` down to ``min_ngram``, prefers the most recent match,
and drafts nothing (a plain decode step, no wasted verification) when no suffix matches.
"""

from __future__ import annotations

import torch

from .base import Drafter

__all__ = ["NgramDrafter"]


class NgramDrafter(Drafter):
    """Prompt lookup: match the longest suffix (``max_ngram`` down to ``min_ngram`` tokens) earlier in the
    sequence and propose the up to k tokens that followed it. Deterministic (one-hot q).

    Args:
        num_speculative_tokens: k, the most tokens proposed per step (>= 1; default
            :data:`~hf_spec.drafters.base.DEFAULT_NUM_SPECULATIVE_TOKENS`).
        max_ngram: longest suffix tried (>= min_ngram).
        min_ngram: shortest suffix tried (>= 1).

    Raises:
        ValueError: k < 1, or the n-gram bounds are not ``1 <= min_ngram <= max_ngram``.
    """

    method = "ngram"

    def __init__(self, num_speculative_tokens: int | None = None, max_ngram: int = 3, min_ngram: int = 1):
        super().__init__(num_speculative_tokens)
        if not (isinstance(min_ngram, int) and isinstance(max_ngram, int) and 1 <= min_ngram <= max_ngram):
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def draft(self, sequences, k):
        found = [self._lookup(row.tolist(), k) for row in sequences]
        device = sequences[0].device
        num_drafted = torch.tensor([len(f) for f in found], dtype=torch.long, device=device)
        width = int(num_drafted.max()) if found else 0
        tokens = torch.zeros(len(found), width, dtype=torch.long, device=device)
        for b, f in enumerate(found):
            tokens[b, : len(f)] = torch.tensor(f, dtype=torch.long)
        return tokens, num_drafted, None

    def _lookup(self, seq: list[int], k: int) -> list[int]:
        length = len(seq)
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            suffix = seq[length - n:]
            # most recent earlier occurrence whose continuation is not empty
            for start in range(length - n - 1, -1, -1):
                if seq[start:start + n] == suffix:
                    follow = seq[start + n:start + n + k]
                    if follow:
                        return follow
        return []
