"""Token indexes for model-free drafting: a suffix trie updated per token, and a suffix array over a corpus.

Both answer the two questions a suffix drafter asks (after SuffixDecoding, Oliaro et al. 2024,
arXiv:2411.04975):

1. the longest match: the longest suffix ``context[-n:]`` (``min_match <= n <= max_match``) that occurs in the
   indexed text with at least one token after it (a continuation);
2. the continuation: starting at that match, the next token that most often followed it (ties: the most
   recent occurrence), then the token that most often followed the match plus that token, and so on; each
   step's empirical probability ``count(pattern + t) / count(pattern with a continuation)``;
3. (:class:`SuffixTrie` only) the speculation tree: the likeliest continuations, several per position where the
   text has several (:meth:`SuffixTrie.tree`).

:class:`SuffixTrie` is dynamic: :meth:`~SuffixTrie.append` adds one token in ``O(max_depth)`` (the nodes of
every suffix of the text of length up to ``max_depth`` are kept as the state, so nothing is ever rescanned),
and the longest match of the text's own end is read off that state. It serves the current prompt and output.

:class:`SuffixArray` is static: built once (prefix doubling with numpy, ``O(N log^2 N)``), ``O(N)`` memory (3
integers per token). A match is a binary search, a continuation step narrows the sorted range. It serves a
corpus the user supplies. :class:`SuffixArrayLevels` keeps growing documents in a few such arrays (a
log-structured merge, bounded in tokens, the oldest dropped first): the drafter's own past outputs.

Documents never match across each other: the trie starts each one from an empty state, the suffix array
separates them with unique negative ids.
"""

from __future__ import annotations

import copy
import heapq
import threading
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

__all__ = ["Proposal", "SuffixTrie", "SuffixArray", "SuffixArrayLevels"]


@dataclass
class Proposal:
    """A continuation proposed by an index.

    Attributes:
        tokens: the proposed token ids, in order.
        probs: per token, its empirical probability given the match and the tokens before it (0 < p <= 1).
        match_length: n, the length of the matched suffix of the context (0: no match, no tokens).
        parents: ``None`` for a chain; for a tree (:meth:`SuffixTrie.tree`), per token the index of its parent
            token in ``tokens`` (-1: it follows the context directly); a parent comes before its children.
        origin: where the match was found: ``"text"`` (the prompt and output so far: :class:`SuffixTrie`),
            ``"corpus"`` (documents the user gave: a :class:`SuffixArray`) or ``"memory"`` (past outputs:
            :class:`SuffixArrayLevels`).
            A match in other documents predicts less than one of the same length in the text itself
            (docs/benchmarks.md, the suffix drafter with a corpus).
    """

    tokens: list[int]
    probs: list[float]
    match_length: int
    parents: list[int] | None = None
    origin: str = "text"

    @property
    def expected_accepted(self) -> float:
        """The tokens expected to be accepted if the probabilities hold: the sum over nodes of the product of
        the probabilities from the first token down to the node (a chain: ``sum_i prod_{j <= i} probs[j]``;
        siblings are exclusive outcomes, so a tree's nodes add up the same way)."""
        if self.parents is None:
            total, cum = 0.0, 1.0
            for p in self.probs:
                cum *= p
                total += cum
            return total
        cums: list[float] = []
        for p, up in zip(self.probs, self.parents):
            cums.append(p * (cums[up] if up >= 0 else 1.0))
        return sum(cums)


class SuffixTrie:
    """Every substring of the indexed text of length <= ``max_depth``, as a trie with occurrence counts.

    Node 0 is the root (the empty string). Per node: its token, ``count`` (occurrences of its string),
    ``cont`` (occurrences followed by another token: the sum of its children's counts), ``best`` (the child
    with the highest count, ties: the one seen last), ``recent`` (the child seen last), and its children as a
    linked list (``first_child``, the newest; ``next_sibling``) for :meth:`tree`. ``best`` and ``recent``
    are kept up to date by :meth:`append` in O(1): a child's count only grows, and the child just counted is
    the most recent one.

    Args:
        max_depth: the longest substring indexed (>= 2); the longest match plus its continuation fit in it.

    Memory: at most ``max_depth`` nodes per indexed token (fewer where substrings repeat), each a dict entry
    and seven list slots (~170 bytes): about 1.7 MB per 1,000 tokens at ``max_depth = 40``.
    """

    def __init__(self, max_depth: int = 40):
        if not (isinstance(max_depth, int) and max_depth >= 2):
            raise ValueError(f"max_depth must be an integer >= 2, got {max_depth!r}")
        self.max_depth = max_depth
        self.children: dict[tuple[int, int], int] = {}
        self.token = [-1]
        self.count = [0]
        self.cont = [0]
        self.best = [-1]
        self.recent = [-1]
        self.first_child = [-1]  # the children of a node as a linked list, newest first (for :meth:`tree`)
        self.next_sibling = [-1]
        self.num_tokens = 0  # tokens appended, all documents together (the position of the next one)

    def __len__(self) -> int:
        """Number of nodes (the root included)."""
        return len(self.token)

    def child(self, node: int, token: int) -> int:
        """The child of ``node`` along ``token``, or -1."""
        return self.children.get((node, token), -1)

    def append(self, state: list[int], token: int) -> list[int]:
        """Index one more token of a document.

        Args:
            state: the document's state: node ids of its current suffixes of length 1, 2, ... (up to
                ``max_depth - 1``); ``[]`` at the start of a document.
            token: the next token id.

        Returns:
            The new state (the caller keeps it for the next token).
        """
        children, count, cont, best, recent = self.children, self.count, self.cont, self.best, self.recent
        new_state = []
        keep = self.max_depth - 1
        parent = 0
        for depth in range(min(len(state), keep) + 1):
            if depth:
                parent = state[depth - 1]
            key = (parent, token)
            c = children.get(key)
            if c is None:
                c = len(self.token)
                children[key] = c
                self.token.append(token)
                count.append(0)
                cont.append(0)
                best.append(-1)
                recent.append(-1)
                self.next_sibling.append(self.first_child[parent])
                self.first_child.append(-1)
                self.first_child[parent] = c
            count[c] += 1
            cont[parent] += 1
            b = best[parent]
            if b < 0 or count[c] >= count[b]:
                best[parent] = c
            recent[parent] = c
            if depth < keep:
                new_state.append(c)
        self.num_tokens += 1
        return new_state

    def extend(self, tokens, state: list[int] | None = None) -> list[int]:
        """:meth:`append` each of ``tokens`` (ints) in order, from ``state`` (default: a new document)."""
        state = [] if state is None else state
        for t in tokens:
            state = self.append(state, int(t))
        return state

    def find(self, pattern) -> int:
        """The node of ``pattern`` (a sequence of ints), or -1 when it does not occur (or is longer than
        ``max_depth``)."""
        node = 0
        for t in pattern:
            node = self.children.get((node, int(t)), -1)
            if node < 0:
                return -1
        return node

    def longest_match(self, state: list[int], min_match: int = 1, max_match: int | None = None) -> tuple[int, int]:
        """The longest suffix of a document's text (given as its ``state``) with a continuation.

        Returns:
            ``(n, node)``: the match length and its node; ``(0, -1)`` when no suffix of length
            ``min_match..max_match`` occurs with a token after it.
        """
        top = min(len(state), max_match if max_match is not None else len(state))
        for n in range(top, min_match - 1, -1):
            node = state[n - 1]
            if self.cont[node] > 0:
                return n, node
        return 0, -1

    def match_of(self, context, min_match: int = 1, max_match: int | None = None) -> tuple[int, int]:
        """:meth:`longest_match` for an arbitrary ``context`` (a sequence of ints, e.g. the current text
        against a trie of other documents): walks each candidate suffix, longest first."""
        top = min(len(context), self.max_depth - 1, max_match if max_match is not None else len(context))
        for n in range(top, min_match - 1, -1):
            node = self.find(context[len(context) - n:])
            if node >= 0 and self.cont[node] > 0:
                return n, node
        return 0, -1

    def continuation(self, node: int, match_length: int, max_tokens: int, min_prob: float = 0.0,
                     most_recent: bool = False) -> Proposal:
        """Walk down from ``node`` (a match of length ``match_length``), at most ``max_tokens`` steps, taking
        the most frequent child (``most_recent``: the child seen last, i.e. the continuation of the most
        recent occurrence) while the product of the empirical probabilities stays >= ``min_prob``."""
        tokens, probs, cum = [], [], 1.0
        pick = self.recent if most_recent else self.best
        while len(tokens) < max_tokens and node >= 0 and self.cont[node] > 0:
            c = pick[node]
            p = self.count[c] / self.cont[node]
            if cum * p < min_prob:
                break
            cum *= p
            tokens.append(self.token[c])
            probs.append(p)
            node = c
        return Proposal(tokens, probs, match_length if tokens else 0)

    def tree(self, node: int, match_length: int, max_nodes: int, max_depth: int, min_prob: float = 0.0) -> Proposal:
        """A speculation tree below ``node`` (a match of length ``match_length``), as SuffixDecoding grows one
        (Oliaro et al. 2024, section 4.2): best first by the continuation's empirical probability, the
        product of ``count(child) / cont(parent)`` from the match down, so the ``max_nodes`` most likely
        continuations of at most ``max_depth`` tokens whose probability is ``>= min_prob``. Ties: the child
        :meth:`continuation` takes (the most frequent, seen last), then the node made later. A node's probability is
        never above its parent's, so parents come before children. Cost: every child of each node taken is
        looked at, in Python: a match with thousands of different continuations costs that many steps.

        Returns:
            A :class:`Proposal` with ``parents`` (per node, the index of its parent node, -1 for a child of the
            text's last token) and ``probs`` the nodes' probabilities given their parents; with one child per
            node it is the chain :meth:`continuation` walks (ties aside).
        """
        count, cont, first, sibling, token = self.count, self.cont, self.first_child, self.next_sibling, self.token
        best = self.best
        heap: list[tuple[float, bool, int, int, int, float]] = []

        def push(parent_node: int, parent_index: int, cum: float, depth: int) -> None:
            if depth > max_depth or cont[parent_node] == 0:
                return
            total = cont[parent_node]
            c = first[parent_node]
            while c >= 0:
                p = count[c] / total
                if cum * p >= min_prob:  # ties: the child :meth:`continuation` would take, then the newest
                    heapq.heappush(heap, (-cum * p, c != best[parent_node], -c, parent_index, depth, p))
                c = sibling[c]

        tokens, parents, probs = [], [], []
        push(node, -1, 1.0, 1)
        while heap and len(tokens) < max_nodes:
            neg_cum, _, neg_c, parent_index, depth, p = heapq.heappop(heap)
            tokens.append(token[-neg_c])
            parents.append(parent_index)
            probs.append(p)
            push(-neg_c, len(tokens) - 1, -neg_cum, depth + 1)
        return Proposal(tokens, probs, match_length if tokens else 0, parents)


class SuffixArray:
    """A suffix array over a fixed set of documents (token id sequences), with occurrence counts by range.

    Args:
        documents: sequences of non-negative token ids.

    Raises:
        ValueError: a negative token id.

    Memory: the tokens and the suffix array, as int64: 16 bytes per token (16 MB per million); the binary searches
    read short slices of the tokens as Python ints, where a whole copy as a Python list had cost 40 bytes more.
    """

    def __init__(self, documents):
        parts, sep = [], -1
        for doc in documents:
            arr = np.asarray(list(doc) if not isinstance(doc, np.ndarray) else doc, dtype=np.int64).reshape(-1)
            if arr.size and int(arr.min()) < 0:
                raise ValueError("token ids must be >= 0")
            if arr.size:
                parts.append(arr)
                parts.append(np.array([sep], dtype=np.int64))  # unique separators: no match spans documents
                sep -= 1
        self.text = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        self.num_tokens = int((self.text >= 0).sum())
        self.sa = _suffix_array(self.text)
        #: occurrences at text positions before this one are not counted (their documents were evicted:
        #: :class:`SuffixArrayLevels`); 0: all
        self.start = 0

    def __len__(self) -> int:
        return self.num_tokens

    def range_of(self, pattern: list[int], lo: int = 0, hi: int | None = None, offset: int = 0) -> tuple[int, int]:
        """``(lo, hi)``: the suffixes in ``sa[lo:hi]`` that start with ``pattern`` (when the range already
        shares ``pattern[:offset]``); empty when ``lo == hi``."""
        sa, text = self.sa, self.text
        hi = len(sa) if hi is None else hi
        n = len(pattern)
        want = pattern[offset:]

        def key(j):
            s = int(sa[j]) + offset
            return text[s:s + n - offset].tolist()  # Python ints: lists compare lexicographically

        a, b = lo, hi
        while a < b:  # first suffix >= pattern
            m = (a + b) // 2
            if key(m) < want:
                a = m + 1
            else:
                b = m
        start = a
        a, b = start, hi
        while a < b:  # first suffix whose prefix > pattern
            m = (a + b) // 2
            if key(m)[: len(want)] == want:
                a = m + 1
            else:
                b = m
        return start, a

    def _next_tokens(self, lo: int, hi: int, n: int) -> np.ndarray:
        """The token after each suffix of ``sa[lo:hi]`` that shares an n-token prefix (negative: a separator, or
        past the end)."""
        pos = self.sa[lo:hi] + n
        out = np.full(hi - lo, -1, dtype=np.int64)
        ok = pos < len(self.text)
        out[ok] = self.text[pos[ok]]
        return out

    def _continued(self, lo: int, hi: int, n: int) -> np.ndarray:
        """Whether each suffix of ``sa[lo:hi]`` (sharing an n-token prefix) has a token after that prefix and
        starts at or after :attr:`start` (in a document still kept)."""
        continued = self._next_tokens(lo, hi, n) >= 0
        return continued if self.start == 0 else continued & (self.sa[lo:hi] >= self.start)

    def runs(self, lo: int, hi: int, n: int) -> tuple[np.ndarray, ...]:
        """The continuations of a range whose suffixes share an n-token prefix: ``(tokens, run_lo, run_hi, counts,
        latest)`` per distinct next token with a counted occurrence, where ``sa[run_lo:run_hi]`` are the suffixes
        followed by it, ``counts`` its counted occurrences and ``latest`` the text position of the last one."""
        nxt = self._next_tokens(lo, hi, n)
        valid = nxt >= 0
        if not bool(valid.any()):
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, empty, empty, empty
        # the range is sorted by the next token (separators, negative, first): runs of equal tokens
        first = int(np.argmax(valid))
        vals = nxt[first:]
        starts = np.flatnonzero(np.r_[True, vals[1:] != vals[:-1]])
        ends = np.r_[starts[1:], len(vals)]
        positions = self.sa[lo + first:hi]
        if self.start == 0:  # every occurrence counts
            return vals[starts], lo + first + starts, lo + first + ends, ends - starts, \
                np.maximum.reduceat(positions, starts)
        counted = positions >= self.start
        counts = np.add.reduceat(counted.astype(np.int64), starts)
        latest = np.maximum.reduceat(np.where(counted, positions, -1), starts)
        keep = counts > 0
        return (vals[starts][keep], (lo + first + starts)[keep], (lo + first + ends)[keep], counts[keep],
                latest[keep])

    def match_of(self, context, min_match: int = 1, max_match: int = 32) -> tuple[int, int, int]:
        """The longest suffix ``context[-n:]`` (``min_match <= n <= max_match``) that occurs with a token after
        it. Existence is monotone in n (a suffix of a match matches), so a binary search on n.

        Returns:
            ``(n, lo, hi)``: the match length and its suffix-array range; ``(0, 0, 0)`` when none.
        """
        context = [int(t) for t in context[max(0, len(context) - max_match):]]
        best = (0, 0, 0)
        a, b = min_match, min(max_match, len(context))
        while a <= b:
            n = (a + b) // 2
            lo, hi = self.range_of(context[len(context) - n:])
            if hi > lo and bool(self._continued(lo, hi, n).any()):
                best, a = (n, lo, hi), n + 1
            else:
                b = n - 1
        return best

    def continuation(self, match_length: int, lo: int, hi: int, max_tokens: int, min_prob: float = 0.0,
                     most_recent: bool = False, origin: str = "corpus") -> Proposal:
        """Walk the sorted range: at each step the next token with the most occurrences (ties, and with
        ``most_recent`` always: the one of the latest occurrence), narrowing the range to it. ``origin``: what
        this array indexes, the proposal's :attr:`Proposal.origin` (``"corpus"`` or ``"memory"``)."""
        return _walk([(self, 0, lo, hi)], match_length, max_tokens, min_prob, most_recent, origin)


def _walk(parts: list[tuple[SuffixArray, int, int, int]], match_length: int, max_tokens: int, min_prob: float,
          most_recent: bool, origin: str) -> Proposal:
    """The continuation of a match over several suffix arrays at once, counting its occurrences in all of them as in
    one: ``parts`` holds ``(array, base, lo, hi)``, the match's range in each array and the array's place in time
    (``base`` + a text position orders occurrences by recency: an array of later documents has the larger base)."""
    tokens, probs, cum, n = [], [], 1.0, match_length
    while len(tokens) < max_tokens:
        found = [(array, base, array.runs(lo, hi, n)) for array, base, lo, hi in parts if hi > lo]
        found = [f for f in found if len(f[2][0])]
        if not found:
            break
        if len(found) == 1:  # one array's runs are distinct tokens already
            distinct, summed, last = found[0][2][0], found[0][2][3], found[0][2][4]
        else:  # a token's occurrences in every array, together
            vals = np.concatenate([r[0] for _, _, r in found])
            counts = np.concatenate([r[3] for _, _, r in found])
            latest = np.concatenate([base + r[4] for _, base, r in found])
            distinct, where = np.unique(vals, return_inverse=True)
            summed = np.zeros(len(distinct), dtype=np.int64)
            np.add.at(summed, where, counts)
            last = np.full(len(distinct), -1, dtype=np.int64)
            np.maximum.at(last, where, latest)
        j = int(np.argmax(last)) if most_recent else int(np.lexsort((last, summed))[-1])  # most, then the latest
        p = float(summed[j]) / int(summed.sum())
        if cum * p < min_prob:
            break
        cum *= p
        token = int(distinct[j])
        tokens.append(token)
        probs.append(p)
        parts = []
        for array, base, (run_vals, run_lo, run_hi, _, _) in found:
            at = [j] if len(found) == 1 else np.flatnonzero(run_vals == token)
            if len(at):
                parts.append((array, base, int(run_lo[at[0]]), int(run_hi[at[0]])))
        n += 1
    return Proposal(tokens, probs, match_length if tokens else 0, origin=origin)


#: :class:`SuffixArrayLevels` merges a new level into the next older one while that one holds at most this many
#: times its tokens
MERGE_FACTOR = 4


class _Level(NamedTuple):
    """One level of :class:`SuffixArrayLevels`: its suffix array, the documents it keeps (oldest first), their
    tokens and their largest token id."""

    array: SuffixArray
    docs: tuple
    tokens: int
    max_id: int


def _level(docs, array: SuffixArray | None = None) -> _Level:
    """A level of ``docs``, over ``array`` (a suffix array that counts just them) or a new one."""
    docs = tuple(docs)
    return _Level(SuffixArray(docs) if array is None else array, docs, sum(len(d) for d in docs),
                  max(int(d.max()) for d in docs))


class SuffixArrayLevels:
    """Documents that arrive over time, at most ``max_tokens`` of them kept (the oldest dropped first), indexed as
    a few :class:`SuffixArray` levels of geometrically shrinking size: a log-structured merge (O'Neil et al. 1996,
    "The log-structured merge-tree"). Each :meth:`add` indexes only the new documents, as a level of their own,
    and merges a level into (rebuilds it together with) the next older one while that one holds at most
    :data:`MERGE_FACTOR` times its tokens: a token is re-sorted ``O(log N)`` times in all, where one suffix array
    rebuilt over everything at every :meth:`add` re-sorted all N tokens each time (docs/benchmarks.md, "Past
    outputs indexed log-structured", has both measured). Documents dropped from the oldest level stop counting at once
    (:attr:`SuffixArray.start`), and that level is rebuilt once more of it is dropped than kept.

    A match and its continuation count the occurrences in all levels together: the same answers as one
    :class:`SuffixArray` over the kept documents (most occurrences, ties to the latest).

    Thread-safe: :meth:`add` (one at a time) builds the new levels aside and swaps them in whole; a match holds
    the levels it was found in, so a reader never sees a half-built index.

    Args:
        max_tokens: the most tokens kept (>= 1); a longer document keeps its last ``max_tokens``.

    Memory: each level's :class:`SuffixArray` (16 bytes per token), and until the oldest level is rebuilt the
    tokens dropped from it (at most as many as it keeps).
    """

    def __init__(self, max_tokens: int):
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens!r}")
        self.max_tokens = max_tokens
        self.levels: list[_Level] = []  # oldest first; replaced whole, never changed in place
        self._lock = threading.Lock()

    @property
    def num_tokens(self) -> int:
        """The tokens kept."""
        return sum(level.tokens for level in self.levels)

    def __len__(self) -> int:
        return self.num_tokens

    @property
    def documents(self) -> list[np.ndarray]:
        """The kept documents, oldest first."""
        return [doc for level in self.levels for doc in level.docs]

    def max_token(self) -> int:
        """The largest token id kept (-1 when none is)."""
        return max((level.max_id for level in self.levels), default=-1)

    def add(self, documents) -> None:
        """Index ``documents`` (sequences or tensors, on any device, of token ids >= 0; empty ones are skipped), then
        drop the oldest beyond ``max_tokens``.

        Raises:
            ValueError: a negative token id.
        """
        new = []
        for doc in documents:
            if hasattr(doc, "detach"):  # a tensor, on any device (a GPU call's outputs: numpy reads host memory only)
                doc = doc.detach().cpu().numpy()
            doc = np.asarray(doc, dtype=np.int64).reshape(-1)[-self.max_tokens:]
            if len(doc) and int(doc.min()) < 0:
                raise ValueError("token ids must be >= 0")
            if len(doc):
                new.append(doc)
        if not new:
            return
        with self._lock:
            levels = self.levels + [_level(new)]
            while len(levels) > 1 and levels[-2].tokens <= MERGE_FACTOR * levels[-1].tokens:
                levels[-2:] = [_level(levels[-2].docs + levels[-1].docs)]
            excess = sum(level.tokens for level in levels) - self.max_tokens
            while excess > 0:  # drop the oldest documents: all in the oldest level
                oldest = levels[0]
                if oldest.tokens <= excess:
                    excess -= oldest.tokens
                    del levels[0]
                    continue
                drop = 0
                while excess > 0:
                    excess -= len(oldest.docs[drop])
                    drop += 1
                gone = sum(len(d) + 1 for d in oldest.docs[:drop])  # the documents and their separators
                start = oldest.array.start + gone
                if start > len(oldest.array.text) - start:  # more dropped than kept: rebuild it
                    levels[0] = _level(oldest.docs[drop:])
                else:  # the same sorted suffixes, counted from the first kept document on
                    shifted = copy.copy(oldest.array)
                    shifted.start = start
                    levels[0] = _level(oldest.docs[drop:], shifted)
            self.levels = levels

    def match_of(self, context, min_match: int = 1, max_match: int = 32) -> tuple[int, tuple]:
        """The longest suffix ``context[-n:]`` (``min_match <= n <= max_match``) that occurs in a kept document
        with a token after it.

        Returns:
            ``(n, parts)``: the match length and where it occurs, for :meth:`continuation` (per level, its suffix
            array, its place in time and the match's range); ``(0, ())`` when none.
        """
        parts, base, n = [], 0, 0
        for level in self.levels:  # one snapshot of the levels, the largest (oldest) first
            # a level counts only with a match as long as the longest so far: search from there
            m, lo, hi = level.array.match_of(context, max(min_match, n), max_match)
            parts.append((m, level.array, base, lo, hi))
            n = max(n, m)
            base += len(level.array.text)
        if not n:
            return 0, ()
        return n, tuple((array, base, lo, hi) for m, array, base, lo, hi in parts if m == n)

    def continuation(self, match_length: int, parts: tuple, max_tokens: int, min_prob: float = 0.0,
                     most_recent: bool = False, origin: str = "memory") -> Proposal:
        """As :meth:`SuffixArray.continuation`, over every level that holds the match (``parts``, from
        :meth:`match_of`)."""
        return _walk(list(parts), match_length, max_tokens, min_prob, most_recent, origin)


def _suffix_array(text: np.ndarray) -> np.ndarray:
    """Suffix array by prefix doubling (Manber and Myers 1993) with numpy sorts: ``int64[N]``, the start
    positions of the suffixes of ``text`` in lexicographic order (a shorter suffix before its extensions)."""
    n = len(text)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    _, rank = np.unique(text, return_inverse=True)
    rank = rank.astype(np.int64) + 1  # 0 = past the end
    k = 1
    while True:
        second = np.zeros(n, dtype=np.int64)
        second[: n - k] = rank[k:] if k < n else second[:0]
        order = np.lexsort((second, rank))
        r, s = rank[order], second[order]
        new = np.empty(n, dtype=np.int64)
        new[order] = np.cumsum(np.r_[True, (r[1:] != r[:-1]) | (s[1:] != s[:-1])])
        rank = new
        if int(rank.max()) == n or k >= n:
            return order.astype(np.int64)
        k *= 2
