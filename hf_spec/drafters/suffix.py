"""Suffix drafter: propose the continuation that most often followed the longest match of the text's end, in
the prompt and output so far, in a corpus the user supplies, and in this drafter's own past outputs.

After SuffixDecoding (Oliaro et al. 2024, "SuffixDecoding: A Model-Free Approach to Speeding Up Large Language
Model Inference", arXiv:2411.04975): model-free, so a draft costs microseconds; the indexes are updated per
emitted token (:class:`~hf_spec.drafters.suffix_index.SuffixTrie`) or built once
(:class:`~hf_spec.drafters.suffix_index.SuffixArray`); the draft length follows the evidence: at most
``max_spec_factor`` x the match length, and only while the continuation's empirical probability (the product
of ``count(pattern + t) / count(pattern)`` along it) stays at or above ``min_token_prob``. Where several
sources match, the proposal with the most expected accepted tokens (the sum of those cumulative
probabilities) wins; a tie goes to the longer match, then to the current text.

Deterministic: the loop verifies its tokens with one-hot q, so greedy output stays the target's and sampled
output keeps the target's distribution whatever is proposed.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping

import numpy as np
import torch

from .base import Drafter, logit_rows
from .suffix_index import Proposal, SuffixArray, SuffixArrayLevels, SuffixTrie

__all__ = ["SuffixDrafter", "MAX_CONTINUATION"]

#: the most a call's index reaches past ``max_match`` (its depth: ``max_match`` + 16, or + k up to this), so a
#: proposal from the current text has at most ``max_match`` + this - its match's length tokens; the index keeps a
#: node per indexed token and depth, and with the depth at k a k of 1,000 on a 3,000-token prompt made 2.5 million
#: nodes (1.7 s, 0.8 GB) where 64 makes 240,000. The suffix drafter's own proposals stop sooner by default
#: (``max_spec_factor`` x the match's length).
MAX_CONTINUATION = 64


class SuffixDrafter(Drafter):
    """Model-free drafting from suffix matches (SuffixDecoding), over the current text, a corpus and past outputs.

    Args:
        num_speculative_tokens: k, the most tokens proposed per step (>= 1; default
            :data:`~hf_spec.drafters.base.DEFAULT_NUM_SPECULATIVE_TOKENS`). The drafter often proposes fewer: see
            ``max_spec_factor`` and ``min_token_prob``; none at all (a plain step) when nothing matches.
        corpus: texts (``str``, tokenized with ``tokenizer``, no special tokens) or token-id sequences to draft
            from besides the current text: documents, code files, earlier answers. Indexed once here, shared by
            every call.
        tokenizer: the target's tokenizer; needed when ``corpus`` holds texts.
        remember_outputs: keep up to this many tokens of this drafter's own generated outputs (across calls and
            threads, oldest dropped first) and draft from them too; 0 (default) keeps none. Memory: 16-24 bytes a
            token (the tokens and suffix arrays over them, int64; :class:`SuffixArrayLevels`). Time: each call's
            outputs are indexed at its end, in the calling thread, as a level of their own merged with older
            levels of at most 4 times their size, so a token is re-sorted ``O(log N)`` times in all rather than
            at every call; the occasional merge of the largest levels costs what sorting them costs (about a
            second for a million tokens on a 2-core CPU: docs/benchmarks.md, "Past outputs indexed
            log-structured").
        max_match: the longest suffix matched (tokens, >= min_match).
        min_match: the shortest suffix matched (tokens, >= 1).
        max_spec_factor: at most ``ceil(max_spec_factor * n)`` tokens are proposed after a match of n tokens
            (> 0; ``math.inf``: up to k, and at most :data:`MAX_CONTINUATION` from the current text); a tree
            (:meth:`draft_tree`) is at most that deep.
        min_token_prob: stop the proposal where the product of its tokens' empirical probabilities falls below
            this (0 <= p <= 1; 0: never); a tree keeps only the nodes whose path's product is at least this.

    Raises:
        ValueError: a bad setting; texts in ``corpus`` without ``tokenizer``; negative token ids.
    """

    method = "suffix"
    takes_corpus = True
    drafts_trees = True
    #: follow the most frequent continuation (False) or the most recent occurrence's (True: prompt lookup)
    most_recent = False

    def __init__(self, num_speculative_tokens: int | None = None, *, corpus=None, tokenizer=None,
                 remember_outputs: int = 0, max_match: int = 16, min_match: int = 1, max_spec_factor: float = 4.0,
                 min_token_prob: float = 0.1):
        super().__init__(num_speculative_tokens)
        if not (_count(min_match) and _count(max_match) and 1 <= min_match <= max_match):
            raise ValueError(f"need integers 1 <= min_match <= max_match, got min_match={min_match!r}, "
                             f"max_match={max_match!r}")
        if not (max_spec_factor > 0) or not (0 <= min_token_prob <= 1):  # NaN fails too
            raise ValueError(f"need max_spec_factor > 0 and 0 <= min_token_prob <= 1, got {max_spec_factor!r}, "
                             f"{min_token_prob!r}")
        if not (_count(remember_outputs) and remember_outputs >= 0):
            raise ValueError(f"remember_outputs must be a number of tokens >= 0, got {remember_outputs!r}")
        self.max_match, self.min_match = int(max_match), int(min_match)
        self.max_spec_factor, self.min_token_prob = max_spec_factor, min_token_prob
        self.corpus = _corpus_index(corpus, tokenizer)
        self.memory = SuffixArrayLevels(int(remember_outputs)) if remember_outputs else None
        self._trie: SuffixTrie | None = None
        self._states: list[list[int]] = []
        self._indexed: list[int] = []
        self._target_vocab: int | None = None

    # ---- the registry ---------------------------------------------------------------------------
    @classmethod
    def from_spec(cls, argument, *, num_speculative_tokens=None, target=None, tokenizer=None, draft_dtype=None,
                  corpus=None):
        """``suffix``: a :class:`SuffixDrafter` with the default settings and ``corpus`` (texts, tokenized with
        ``tokenizer``)."""
        return cls(num_speculative_tokens, corpus=corpus, tokenizer=tokenizer)

    # ---- one call -------------------------------------------------------------------------------
    def prepare(self, target, input_ids) -> None:
        vocab = logit_rows(target)
        if self.corpus is not None and self.corpus.num_tokens and int(self.corpus.text.max()) >= vocab:
            raise ValueError(f"the corpus holds token ids up to {int(self.corpus.text.max())} but the target has "
                             f"{vocab} logit rows: tokenize the corpus with the target's tokenizer")
        remembered = self.memory.max_token() if self.memory is not None else -1
        if remembered >= vocab:
            raise ValueError(f"this drafter remembers outputs with token ids up to {remembered} but the "
                             f"target has {vocab} logit rows: its past outputs come from another vocabulary; use "
                             "one SuffixDrafter per target")
        self._target_vocab = vocab
        # one trie per call, every row a document of it (rows may draft from each other's text)
        self._trie = SuffixTrie(self.max_match + min(max(16, self.num_speculative_tokens), MAX_CONTINUATION))
        self._states = [[] for _ in range(input_ids.shape[0])]
        self._indexed = [0] * input_ids.shape[0]

    def select_rows(self, rows) -> None:
        self._states = [self._states[int(r)] for r in rows]
        self._indexed = [self._indexed[int(r)] for r in rows]

    def finish(self, outputs) -> None:
        if self.memory is not None:
            self.memory.add(list(outputs))

    def index(self, sequences: list[torch.LongTensor]) -> None:
        """Bring the call's trie up to date: each row's tokens not indexed yet (the prompt at the first draft,
        then the tokens emitted since), one :meth:`~SuffixTrie.append` each."""
        if self._trie is None:
            raise RuntimeError("draft() on a SuffixDrafter not bound to a call: the loop calls start() first")
        for b, seq in enumerate(sequences):
            if len(seq) > self._indexed[b]:
                self._states[b] = self._trie.extend(seq[self._indexed[b]:].tolist(), self._states[b])
                self._indexed[b] = len(seq)

    def propose(self, b: int, sequence: torch.LongTensor, k: int, num_nodes: int = 0) -> Proposal:
        """Row b's proposal of at most k tokens (after :meth:`index`): the best of the current text's, the
        corpus's and past outputs' (most expected accepted tokens, then the longer match, then the current
        text); its ``origin`` says which. With ``num_nodes``, the current text's proposal is a speculation tree
        of at most that many nodes (:meth:`~hf_spec.drafters.suffix_index.SuffixTrie.tree`, k deep); the corpus's
        and past outputs' stay chains."""
        n, node = self._trie.longest_match(self._states[b], self.min_match, self.max_match)
        candidates = []
        if n and num_nodes:
            candidates.append(self._trie.tree(node, n, num_nodes, self._limit(n, k), self.min_token_prob))
        elif n:
            candidates.append(self._trie.continuation(node, n, self._limit(n, k), self.min_token_prob,
                                                      self.most_recent))
        context = None
        for origin, index in (("corpus", self.corpus), ("memory", self.memory)):
            if index is None:
                continue
            if context is None:
                context = sequence[-self.max_match:].tolist()
            m, *where = index.match_of(context, self.min_match, self.max_match)  # where it matched, for continuation
            if m and m >= n:  # a shorter match than the current text's is weaker evidence
                limit = self._limit(m, k) if not num_nodes else min(self._limit(m, k), num_nodes)
                candidates.append(index.continuation(m, *where, limit, self.min_token_prob, self.most_recent, origin))
        best = Proposal([], [], 0)
        for c in candidates:
            if (c.expected_accepted, c.match_length) > (best.expected_accepted, best.match_length):
                best = c
        return best

    def _limit(self, n: int, k: int) -> int:
        return k if math.isinf(self.max_spec_factor) else max(1, min(k, math.ceil(self.max_spec_factor * n)))

    def draft(self, sequences, k):
        self.index(sequences)
        found = [self.propose(b, seq, k).tokens for b, seq in enumerate(sequences)]
        return _padded(found, 0), torch.tensor([len(f) for f in found], dtype=torch.long), None

    def draft_tree(self, sequences, k, num_nodes):
        """SuffixDecoding's speculation tree per row (Oliaro et al. 2024, section 4.2): the ``num_nodes`` most
        likely continuations of the longest match, at most k deep (and ``max_spec_factor`` x the match length),
        none below ``min_token_prob`` (:meth:`~hf_spec.drafters.suffix_index.SuffixTrie.tree`); a corpus's or past
        outputs' chain where it promises more. Deterministic nodes (no scores): verified with one-hot q, so
        greedy output stays the target's and sampled output keeps its distribution.

        Returns:
            ``(tokens [B, N], num_drafted [B], None, parents [B, N])``, ``N <= num_nodes``.
        """
        self.index(sequences)
        found = [self.propose(b, seq, k, num_nodes) for b, seq in enumerate(sequences)]  # each <= num_nodes
        parents = [p.parents if p.parents is not None else list(range(-1, len(p.tokens) - 1)) for p in found]
        return (_padded([p.tokens for p in found], 0), torch.tensor([len(p.tokens) for p in found], dtype=torch.long),
                None, _padded(parents, -1))


def _count(x) -> bool:
    """An integer setting (numpy's too), not a boolean: ``True`` read as 1 hid a misread option."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _padded(rows: list[list[int]], fill: int) -> torch.LongTensor:
    """``LongTensor[B, max length]``: the rows, each padded on the right with ``fill``."""
    width = max(map(len, rows), default=0)
    return torch.tensor([r + [fill] * (width - len(r)) for r in rows], dtype=torch.long).reshape(len(rows), width)


def _corpus_index(corpus, tokenizer) -> SuffixArray | None:
    """The suffix array over ``corpus`` (texts, token-id sequences or tensors), or ``None`` for no corpus.

    Raises:
        ValueError: a corpus that is not a collection of documents (a number, a mapping such as a tokenizer's
            ``BatchEncoding``), texts without ``tokenizer``, a text that is not Unicode (a lone surrogate), or a
            document that is not a text or a sequence of integer token ids in ``[0, 2**63)`` (floats, booleans,
            bytes and numeric strings are refused rather than converted).
    """
    if corpus is None:
        return None
    if isinstance(corpus, Mapping):  # e.g. a tokenizer's BatchEncoding: iterating it gives its keys
        raise ValueError(f"corpus is a mapping (keys {list(corpus)[:3]}): give the texts, or token-id sequences such as "
                         "a tokenizer's output['input_ids']")
    if isinstance(corpus, str) or (_is_array(corpus) and corpus.ndim == 1):
        corpus = [corpus]
    if isinstance(corpus, bytes) or not isinstance(corpus, Iterable) or (_is_array(corpus) and corpus.ndim == 0):
        raise ValueError(f"corpus must be a list of documents (texts or token-id sequences), got "
                         f"{type(corpus).__name__}")
    docs = []
    for i, doc in enumerate(corpus):
        if isinstance(doc, str):
            if tokenizer is None:
                raise ValueError("the corpus holds texts: pass tokenizer= (the target's) to tokenize them, or give "
                                 "token-id sequences")
            bad = lone_surrogate(doc)  # the tokenizer cannot take one
            if bad:
                raise ValueError(f"corpus[{i}] is not Unicode text: {bad}, half of a character cut in two")
            docs.append(np.asarray(tokenizer(doc, add_special_tokens=False)["input_ids"], dtype=np.int64))
        else:
            docs.append(_token_ids(doc, i))
    return SuffixArray(docs)


def lone_surrogate(text: str) -> str | None:
    """``"a lone surrogate (\\udXXX) at character N"`` for the first half of a surrogate pair in ``text`` without its
    other half (JSON can escape one: a string cut inside an emoji), which no tokenizer takes; ``None`` for Unicode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"a lone surrogate ({text[e.start:e.end].encode('unicode_escape').decode()}) at character {e.start}"
    return None


def _is_array(x) -> bool:
    """A torch tensor or a numpy array (anything with ``dtype``, ``ndim`` and ``tolist``)."""
    return isinstance(x, torch.Tensor) or all(hasattr(x, a) for a in ("dtype", "ndim", "tolist"))


def _token_ids(doc, i: int) -> np.ndarray:
    """``corpus[i]`` as int64 token ids: an integer tensor or array (any shape, flattened) or a sequence of
    integers; anything else, and ids outside ``[0, 2**63)``, raise ``ValueError``."""
    bad = None
    if _is_array(doc):
        if isinstance(doc, torch.Tensor):
            integer = not (doc.dtype.is_floating_point or doc.dtype.is_complex or doc.dtype == torch.bool)
        else:  # numpy: signed or unsigned integers
            integer = getattr(doc.dtype, "kind", "") in ("i", "u")
        ids = doc.reshape(-1).tolist() if integer else None
        bad = None if integer else f"an array of {doc.dtype}"
    elif isinstance(doc, (bytes, bytearray, Mapping)) or not isinstance(doc, Iterable):
        ids, bad = None, type(doc).__name__
    else:
        ids = list(doc)
        wrong = next((t for t in ids if not isinstance(t, numbers.Integral) or isinstance(t, bool)), None)
        if wrong is not None:
            ids, bad = None, f"a sequence holding {wrong!r} ({type(wrong).__name__})"
    if ids is None:
        raise ValueError(f"corpus[{i}] is {bad}, not a text or a sequence of integer token ids: give texts (str) or "
                         "token-id sequences (lists of int, integer tensors)")
    low, high = (min(ids), max(ids)) if ids else (0, 0)
    if not (0 <= low and high < 2 ** 63):
        raise ValueError(f"corpus[{i}] holds token id {low if low < 0 else high}: token ids are >= 0 and below the "
                         "target's vocabulary size; tokenize with the target's tokenizer")
    return np.asarray(ids, dtype=np.int64)
