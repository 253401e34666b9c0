"""Medusa drafter: the target's own hidden state, through Medusa heads, proposes the next k tokens.

Medusa (Cai et al. 2024) drafts with no extra model forward: the hidden state the target computed at the
last accepted position, in the verify forward that just ran, goes through N small heads; head i proposes
the token i + 2 positions ahead (the target's own ``lm_head`` gave the token at i + 1, which the loop has
already emitted). By default hf-spec proposes the top-1 chain (one candidate per head) and verifies it with
the same acceptance rule as every drafter, so greedy output is token-identical to the target's and
sampling is distribution-exact: under sampling each head's token is drawn from the head's logits after the
call's logits processors, and that distribution is q in speculative sampling.

With ``num_tree_nodes=N`` in the call it proposes Medusa's candidate tree instead (Cai et al. 2024, section 2.1.2, "tree attention"):
a node at depth d is a path ``(r_1, .., r_d)`` of ranks, its token head d's r_d-th most likely one, its parent
the path without its last rank; the target verifies every node in one forward
(:func:`~hf_spec.acceptance.greedy_accept_tree`). The nodes are deterministic given the text (top-ranked
tokens), so under sampling q is one-hot and recursive rejection sampling keeps the target's distribution.
:func:`sparse_tree` chooses the N paths from per-(head, rank) accuracies, as Medusa's sparse trees do
(measured in the call: each tree step's ranked tokens are scored against the tokens the target emitted after
it, starting from :func:`prior_accuracy`).

The drafter asks the loop for the target's hidden states (``needs_hidden_states``): after every target
forward, plain or speculative, the loop hands it the last hidden states (after the final norm, what
``lm_head`` reads) of the positions it scored, and the drafter keeps, per row, the one that predicted the
row's newest token (:meth:`~hf_spec.drafters.base.VerifyOutput.last_hidden_state`). No hook is left on the target
that another call could see, so any number of calls and threads can share it. Heads that share the target's
``lm_head`` ask the loop to project their rows in the target's verify forwards (:meth:`head_rows`;
:func:`hf_spec.kernels.extra_rows`, state on the calling thread only) where one product over the target's and the
heads' rows was measured faster than two: the vocabulary projection's weights (a 151,936 x 1,536 matrix for Qwen2.5)
are then read once per step, not twice. Heads with a token map (vLLM's ``truncated_vocab_size``; see
:mod:`hf_spec.medusa.heads`) project only the accepted position's rows, over the map's rows of the projection, after
the forward; their drafts are the map's ids. Medusa's "typical acceptance" (accepting
tokens the target finds merely plausible) is lossy and is not offered.
"""

from __future__ import annotations

import os

import torch

from ..medusa.heads import MedusaHeads
from .base import Drafter, VerifyOutput, check_num_speculative_tokens

__all__ = ["MedusaDrafter", "sparse_tree"]

#: the ranks per head a tree may use
RANKS = 8
#: how many observations the prior counts for, against a call's measured hits
PRIOR_WEIGHT = 8.0
#: the logit a chain draft gives ids outside the heads' token map: probability 0 in float32 next to any mapped
#: id's, yet finite, so that a token the call's processors allow is drafted when they forbid every mapped one
OUTSIDE_MAP = -1e9


def prior_accuracy(d: int, r: int) -> float:
    """The probability that head d's rank-r token is the target's (d, r from 0) before any was measured:
    ~0.6 x 0.7^d x 0.45^r, the shape of Medusa-1's reported top-k accuracies (each head less accurate than the
    one before, each rank less than the one above)."""
    return 0.6 * 0.7 ** d * 0.45 ** r




def sparse_tree(accuracy: list[list[float]], num_nodes: int) -> list[tuple[int, ...]]:
    """Medusa's sparse candidate tree: the ``num_nodes`` rank paths with the largest expected acceptance.

    A path ``(r_1, .., r_d)`` is accepted when head i's rank-r_i token is the target's at depth i for every i,
    with probability ~ the product of ``accuracy[i][r_i]`` (heads taken as independent, as Medusa does). Paths
    are taken best first; a path's product never exceeds its parent's, so every chosen path's parent is chosen
    too (Cai et al. 2024, "Medusa", section 2.1.2 and appendix: sparse trees from calibrated accuracies).

    Args:
        accuracy: ``accuracy[d][r]``, the probability that head d's rank-r token is the target's (d, r from 0).
        num_nodes: how many nodes (>= 1).

    Returns:
        the paths (tuples of ranks), by depth then rank: a parent before its children.

    Raises:
        ValueError: ``num_nodes`` < 1 or no accuracies.
    """
    import heapq

    if num_nodes < 1 or not accuracy or not accuracy[0]:
        raise ValueError(f"need num_nodes >= 1 and accuracies for at least one head and rank, got {num_nodes}")
    heap = [(-a, (r,)) for r, a in enumerate(accuracy[0])]
    heapq.heapify(heap)
    chosen: list[tuple[int, ...]] = []
    while heap and len(chosen) < num_nodes:
        neg, path = heapq.heappop(heap)
        chosen.append(path)
        if len(path) < len(accuracy):
            for r, a in enumerate(accuracy[len(path)]):
                heapq.heappush(heap, (neg * a, path + (r,)))
    return sorted(chosen, key=lambda p: (len(p), p))


class MedusaDrafter(Drafter):
    """Speculate with Medusa heads on the target's last hidden state.

    Args:
        heads: :class:`~hf_spec.medusa.heads.MedusaHeads`, or the path of a heads folder (vLLM's or
            FasterDecoding's layout, see :mod:`hf_spec.medusa.heads`) or the short name of shipped heads or of heads
            trained into the cache.
        num_speculative_tokens: k, tokens drafted per step; at most the number of heads (default: all heads).
            With a tree (``num_tree_nodes``), the most heads a path uses (its depth).

    Raises:
        ValueError: k < 1 or k > the number of heads; (from ``start``) heads on another device than the target's
            ``lm_head``.
        MedusaCheckpointError: (here or from ``start``) unreadable heads, or heads whose hidden size or
            vocabulary differ from the target's.
    """

    method = "medusa"
    returns_scores = True
    drafts_trees = True
    needs_hidden_states = True
    spec_argument = "DIR"

    def __init__(self, heads: MedusaHeads | str | os.PathLike, num_speculative_tokens: int | None = None):
        if not isinstance(heads, MedusaHeads):
            heads = MedusaHeads.from_pretrained(heads)
        self.heads = heads
        if num_speculative_tokens is not None:
            self._check_k(num_speculative_tokens)  # names the head count
        super().__init__(heads.num_heads if num_speculative_tokens is None else num_speculative_tokens)
        self._last: torch.Tensor | None = None  # [B, H]: per row, the hidden state that predicted its newest token

    @property
    def max_num_speculative_tokens(self) -> int:
        """One token per head."""
        return self.heads.num_heads

    def _check_k(self, k: int) -> None:
        check_num_speculative_tokens(k)
        if k > self.heads.num_heads:
            raise ValueError(
                f"num_speculative_tokens={k} but the Medusa checkpoint has {self.heads.num_heads} heads; "
                f"use k <= {self.heads.num_heads} (or leave k unset: all heads) or train more heads "
                "(hf-spec train-medusa --heads N)")

    @classmethod
    def check_spec(cls, argument, num_speculative_tokens=None) -> None:
        """``medusa:DIR``: DIR must be a heads folder (or the name of shipped or cached heads) with a config and
        weights, and a given k at most its head count (read from the config; nothing is loaded)."""
        super().check_spec(argument, num_speculative_tokens)
        from ..medusa.heads import checkpoint_num_heads, heads_path

        path = heads_path(argument)  # MedusaCheckpointError (a ValueError) names what is missing
        heads = checkpoint_num_heads(path)
        if isinstance(num_speculative_tokens, int) and isinstance(heads, int) and num_speculative_tokens > heads:
            raise ValueError(f"k={num_speculative_tokens} but the Medusa checkpoint {path} has {heads} heads (one "
                             f"drafted token each); use k <= {heads}, or leave k unset (all heads)")

    @classmethod
    def spec_num_speculative_tokens(cls, argument) -> int:
        """``medusa:DIR``: the checkpoint's head count (from its config, ``num_heads`` in vLLM's layout or
        ``medusa_num_heads`` in FasterDecoding's; nothing is loaded)."""
        from ..medusa.heads import _count, _read_config, heads_path

        path = heads_path(argument)
        heads = _count(_read_config(path), path, ("num_heads", "medusa_num_heads"))
        if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1:
            raise ValueError(f"{path}/config.json: num_heads (medusa_num_heads) must be an integer >= 1, got {heads!r}")
        return heads

    @classmethod
    def from_spec(cls, argument, *, num_speculative_tokens=None, target=None, tokenizer=None, draft_dtype=None):
        """``medusa:DIR``: the heads in DIR (or shipped / cached under that name), checked against and bound
        to ``target``; k defaults to the number of heads."""
        heads = MedusaHeads.from_pretrained(argument, target=target)
        if target is not None:
            heads.to(target.get_output_embeddings().weight.device)
        return cls(heads, num_speculative_tokens)

    def prepare(self, target, input_ids) -> None:
        self.heads.check_target(target)  # MedusaCheckpointError on a size mismatch
        # this call's projection: the shared heads are never rebound, so calls on other targets cannot change it
        self._lm_head = target.get_output_embeddings().weight
        if next(self.heads.parameters()).device != self._lm_head.device:
            raise ValueError(f"the Medusa heads are on {next(self.heads.parameters()).device}, the target's lm_head on "
                             f"{self._lm_head.device}: put them on one device (heads.to(device)) before generating")
        self._last = None
        self._last_logits: torch.Tensor | None = None  # [B, heads, V]: the heads' logits from the target's forward
        # every head, at every scored position: the next step's k is not known at the forward. Not with a token
        # map: its rows are a fifth of the lm_head or less, and projecting the one accepted position's rows
        # after the forward (in draft) costs less than every position's inside it
        self.head_rows_per_position = (self.heads.num_heads if self.heads.shares_lm_head
                                       and self.heads.token_map is None else 0)
        # per (head, rank): how often head d's rank-r token was the target's, where the text reached depth d
        self._hits = [[0.0] * RANKS for _ in range(self.heads.num_heads)]
        self._trials = [0.0] * self.heads.num_heads
        self._top: torch.Tensor | None = None  # [B, k, RANKS]: the last tree step's ranked tokens per head
        self._lengths: list[int] | None = None  # the rows' lengths at that step

    def head_rows(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """``[B, n, heads, H]``: every head's input to the shared ``lm_head`` at each of the ``[B, n, H]`` hidden
        states."""
        return self.heads.hidden(hidden_states)

    def update(self, verified: VerifyOutput) -> None:
        self._last = verified.last_hidden_state()
        self._last_logits = verified.last_head_logits()

    def select_rows(self, rows):
        if self._last is not None:
            self._last = self._last[rows.to(self._last.device)]
        if self._last_logits is not None:
            self._last_logits = self._last_logits[rows.to(self._last_logits.device)]
        if self._top is not None:
            self._top = self._top[rows.to(self._top.device)]
            self._lengths = [self._lengths[int(r)] for r in rows]

    def accuracy(self, depth: int) -> list[list[float]]:
        """``[d][r]``: the estimated probability that head d's rank-r token is the target's (d < depth): this
        call's counts where the text reached depth d, plus :data:`PRIOR_WEIGHT` observations of
        :func:`prior_accuracy`."""
        return [[(self._hits[d][r] + PRIOR_WEIGHT * prior_accuracy(d, r)) / (self._trials[d] + PRIOR_WEIGHT)
                 for r in range(RANKS)] for d in range(depth)]

    def _count(self, sequences) -> None:
        """Score the last tree step's ranked tokens against what the target emitted after it (the tokens the rows
        gained since): head d is judged where the first d - 1 emitted tokens were its predecessors' (the text
        reached depth d), as the accepted path shows."""
        if self._top is None:
            return
        for b, seq in enumerate(sequences):
            new = seq[self._lengths[b]:].tolist()
            for d, token in enumerate(new[: self._top.shape[1]]):
                self._trials[d] += 1
                ranks = (self._top[b, d] == token).nonzero()
                if len(ranks):
                    self._hits[d][int(ranks[0])] += 1
        self._top = None

    def _logits(self, k: int, truncated: bool = False) -> torch.Tensor:
        """``[B, k, V]`` float32: the first k heads' logits at each row's newest token, from the target's forward
        where it projected them, else projected here. With a token map the heads score only its ids: ``[B, k,
        V']`` when ``truncated``, else :data:`OUTSIDE_MAP` at every other id (a floor, not -inf: should the call's
        processors rule out every mapped id, the draft takes a token they allow instead of one they forbid)."""
        if self._last_logits is not None:
            return self._last_logits[:, :k].float()
        return self.heads(self._last, num_heads=k, lm_head=self._lm_head, truncated=truncated, outside=OUTSIDE_MAP).float()

    @torch.no_grad()
    def draft(self, sequences, k):
        if self._last is None or self._last.shape[0] != len(sequences):
            raise RuntimeError("MedusaDrafter.draft() before the target's first forward: the loop calls start() "
                               "and update() first")
        logits = self._logits(k)
        seqs = [s.to(logits.device) for s in sequences]
        tokens, scores = [], []
        for i in range(k):
            token, processed = self.choose(seqs, logits[:, i])
            tokens.append(token)
            scores.append(processed)
            if i < k - 1:
                seqs = [torch.cat([s, t[None]]) for s, t in zip(seqs, token)]
        num_drafted = torch.full((len(seqs),), k, dtype=torch.long)
        do_sample = bool(self.generation_config.do_sample)
        return torch.stack(tokens, dim=1), num_drafted, (torch.stack(scores, dim=1) if do_sample else None)

    @torch.no_grad()
    def draft_tree(self, sequences, k, num_nodes):
        """Medusa's sparse tree of ``num_nodes`` rank paths at most k deep (:func:`sparse_tree`), every node a head's
        top-ranked token: ``(tokens [B, N], num_drafted [B], None, parents [B, N])``; deterministic, so q is
        one-hot under sampling."""
        if self._last is None or self._last.shape[0] != len(sequences):
            raise RuntimeError("MedusaDrafter.draft_tree() before the target's first forward: the loop calls start() "
                               "and update() first")
        self._count(sequences)
        ranks = self._ranks()  # a token map of fewer ids than RANKS has fewer ranks per head
        paths = sparse_tree([row[:ranks] for row in self.accuracy(k)], num_nodes)
        out = self.tree_of_paths(paths, k)
        self._lengths = [len(s) for s in sequences]
        return out

    def _ranks(self) -> int:
        """The ranks a head offers a tree: :data:`RANKS`, or fewer where the heads score fewer ids (a token map)."""
        return min(RANKS, self.heads.config.truncated_vocab_size or self.heads.config.vocab_size)

    @torch.no_grad()
    def tree_of_paths(self, paths: list[tuple[int, ...]], k: int):
        """The rank ``paths`` (tuples, each with its parent among them, by depth) as a draft tree from the heads'
        logits at each row's newest token: ``(tokens [B, N], num_drafted [B], None, parents [B, N])``.

        Raises:
            ValueError: a rank the heads do not have (at most :meth:`_ranks` per head: fewer with a small token map).
        """
        ranks = self._ranks()
        if any(r >= ranks for p in paths for r in p):
            scored = self.heads.config.truncated_vocab_size or self.heads.config.vocab_size
            raise ValueError(f"the Medusa heads score {scored} token ids, so a tree path's ranks must be below {ranks}; "
                             f"got rank {max(max(p) for p in paths)}")
        mapped = self._last_logits is None and self.heads.token_map is not None
        logits = self._logits(k, truncated=True)
        index = {p: j for j, p in enumerate(paths)}
        top = logits.topk(min(RANKS, logits.shape[-1]), dim=-1).indices  # [B, k, R]
        if mapped:  # column j of truncated logits scores token_map[j]
            top = self.heads.token_map.to(top.device)[top]
        self._top = top
        tokens = torch.stack([top[:, len(p) - 1, p[-1]] for p in paths], dim=1)
        parents = torch.tensor([index[p[:-1]] if len(p) > 1 else -1 for p in paths]).expand(len(tokens), -1)
        return tokens, torch.full((len(tokens),), len(paths), dtype=torch.long), None, parents.clone()
