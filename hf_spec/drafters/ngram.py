"""N-gram prompt-lookup drafter: propose the tokens that followed the most recent earlier occurrence of the
longest matching suffix (``max_ngram`` down to ``min_ngram`` tokens) of the text seen so far (prompt and
generated tokens). Zero model cost.

After Saxena 2023, "Prompt Lookup Decoding", and transformers' ``PromptLookupCandidateGenerator``: the same
proposals, read off the suffix drafter's incremental index
(:class:`~hf_spec.drafters.suffix_index.SuffixTrie`, one update per emitted token) instead of a rescan of the
sequence at every step; nothing is drafted (a plain step, no wasted verification) when no suffix matches.
:class:`~hf_spec.drafters.suffix.SuffixDrafter` (``--drafter suffix``) proposes the most frequent continuation
instead, sized by the evidence, and also drafts from a corpus and past outputs.
"""

from __future__ import annotations

import math

from .base import Drafter
from .suffix import SuffixDrafter, _count

__all__ = ["NgramDrafter"]


class NgramDrafter(SuffixDrafter):
    """Prompt lookup: match the longest suffix (``max_ngram`` down to ``min_ngram`` tokens) earlier in the
    sequence and propose the up to k tokens that followed its most recent occurrence (at most 16 past the
    match, the index's depth beyond ``max_ngram``, or k when k is larger, up to
    :data:`~hf_spec.drafters.suffix.MAX_CONTINUATION`). Deterministic (one-hot q).

    Args:
        num_speculative_tokens: k, the most tokens proposed per step (>= 1; default
            :data:`~hf_spec.drafters.base.DEFAULT_NUM_SPECULATIVE_TOKENS`).
        max_ngram: longest suffix tried (>= min_ngram).
        min_ngram: shortest suffix tried (>= 1).

    Raises:
        ValueError: k < 1, or the n-gram bounds are not ``1 <= min_ngram <= max_ngram``.
    """

    method = "ngram"
    takes_corpus = False
    most_recent = True
    drafts_trees = False  # the most recent continuation is one path: no tree
    draft_tree = Drafter.draft_tree  # (SuffixDrafter's trees rank by frequency, which prompt lookup does not)

    def __init__(self, num_speculative_tokens: int | None = None, max_ngram: int = 3, min_ngram: int = 1):
        if not (_count(min_ngram) and _count(max_ngram) and 1 <= min_ngram <= max_ngram):
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}")
        super().__init__(num_speculative_tokens, max_match=max_ngram, min_match=min_ngram,
                         max_spec_factor=math.inf, min_token_prob=0.0)
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    @classmethod
    def from_spec(cls, argument, *, num_speculative_tokens=None, target=None, tokenizer=None, draft_dtype=None):
        return cls(num_speculative_tokens)
