"""The acceptance rule: one pair of pure tensor functions shared by every drafter.

Given k drafted tokens and the target's (processed) scores at the k+1 positions that one verify forward
returns, decide how many drafted tokens to keep and which token the target adds after them: the
*correction* (after a rejection) or the *bonus* token (when all k were accepted). Every step of
speculative decoding therefore emits between 1 and k+1 tokens.

- :func:`greedy_accept`: keep the longest prefix of the draft that equals the target's argmax; the next
  token is the target's argmax after it. The output is token-for-token the target's own greedy output.
- :func:`speculative_sample`: speculative (rejection) sampling, Leviathan et al. 2023, "Fast Inference
  from Transformers via Speculative Decoding", Algorithm 1; Chen et al. 2023, "Accelerating Large
  Language Model Decoding with Speculative Sampling". Accept drafted token x_i with probability
  ``min(1, p_i(x_i) / q_i(x_i))``; at the first rejection sample from ``normalize(max(p_i - q_i, 0))``;
  when all k are accepted sample the bonus token from ``p_{k+1}``. The emitted tokens are distributed
  exactly as tokens sampled from the target alone. A deterministic drafter (n-gram lookup) has one-hot q:
  pass ``draft_probs=None``.

A draft may also be a *tree* (several candidates where the drafter is unsure; a chain is the tree with one child
per node): :func:`greedy_accept_tree` and :func:`speculative_sample_tree` walk it from the root with the same two
rules, sampling with the multi-candidate (recursive) rejection sampling of SpecInfer (Miao et al. 2024,
"SpecInfer: Accelerating Large Language Model Serving with Tree-based Speculative Inference and Verification",
Algorithm 2 / Theorem 4.2): the children of a node are tried in turn against the target's distribution, each
rejection replacing it by the residual ``normalize(max(p - q, 0))``; all rejected: the next token is drawn from
what is left.
The chain functions are the tree functions walking a chain (:func:`chain_parents`), so each rule has one
implementation, and the loop calls the tree functions for both shapes.

Both work on a batch: every tensor has a leading batch dimension and the number of accepted tokens is
per row. Rows may draft different numbers of tokens: ``num_drafted[b]`` says how many of the k columns
of row b are real; the rest are filler that is never accepted, and the row's next token is then drawn
from the target alone at position ``num_drafted[b]`` (the bonus token of a shorter draft).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["greedy_accept", "speculative_sample", "greedy_accept_tree", "speculative_sample_tree", "tree_depths",
           "chain_parents"]


def greedy_accept(
    draft_tokens: torch.Tensor, target_scores: torch.Tensor, num_drafted: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy verification.

    Args:
        draft_tokens: ``LongTensor[B, k]``, the drafted tokens (k may be 0).
        target_scores: ``Tensor[B, k+1, V]``, the target's processed scores (logits after logits
            processors) at the k+1 verified positions: position i scores the token after draft token i-1.
        num_drafted: optional ``LongTensor[B]`` in ``0..k``, how many leading draft columns are real per
            row (default: all k).

    Returns:
        ``(num_accepted, next_token)``: ``LongTensor[B]`` in ``0..k``, the length of the accepted draft
        prefix, and ``LongTensor[B]``, the target's token after it (correction or bonus token).

    This is :func:`greedy_accept_tree` on the chain (:func:`chain_parents`).

    Raises:
        ValueError: the shapes do not agree.
    """
    _check_shapes(draft_tokens, target_scores)
    bsz, k = draft_tokens.shape
    num_accepted, _, next_token = greedy_accept_tree(draft_tokens, chain_parents(bsz, k, draft_tokens.device),
                                                     target_scores, num_drafted)
    return num_accepted, next_token


#: device types where an acceptance walk computes what it reads of each position when it first reads it (an argmax,
#: the target's processed distribution): on a CPU a walk reads only the positions up to its rejections, and each is
#: a pass over the whole vocabulary; elsewhere all positions at once (one kernel, one copy to the host)
LAZY_DEVICES = ("cpu",)


class _Argmax:
    """``scores [B, P, V]`` -> ``(b, p)`` -> the argmax of row b at position p (the first of equal maxima). On a
    CPU each is computed the first time it is asked for: an acceptance walk reads only the positions up to its
    rejections, and each argmax is a scan of the whole vocabulary. On other devices all are computed at once (one
    kernel and one copy to the host instead of one per position)."""

    #: device types where each argmax is computed when first asked for
    lazy_devices = LAZY_DEVICES

    def __init__(self, scores: torch.Tensor):
        self.scores = scores
        self.known = None if scores.device.type in self.lazy_devices else scores.argmax(dim=-1).tolist()
        self.lazy: dict[tuple[int, int], int] = {}

    def __call__(self, b: int, p: int) -> int:
        if self.known is not None:
            return self.known[b][p]
        if (b, p) not in self.lazy:
            self.lazy[b, p] = int(self.scores[b, p].argmax())
        return self.lazy[b, p]


def speculative_sample(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
    num_drafted: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative (rejection) sampling (Leviathan et al. 2023, Algorithm 1).

    Args:
        draft_tokens: ``LongTensor[B, k]``, tokens the drafter sampled.
        draft_probs: ``Tensor[B, k, V]``, the distributions the drafter sampled them from (after the same
            logits processors as the target), or ``None`` for a deterministic drafter (one-hot q).
        target_probs: ``Tensor[B, k+1, V]``, the target's processed distributions at the k+1 positions.
        generator: optional ``torch.Generator`` for the uniform draws and the residual sample.
        num_drafted: optional ``LongTensor[B]`` in ``0..k``, how many leading draft columns are real per
            row (default: all k). A row's filler columns are never accepted and never form a residual.

    Returns:
        ``(num_accepted, next_token)``, both ``LongTensor[B]``: accepted prefix length in ``0..k``, and the
        token sampled after it: from ``normalize(max(p - q, 0))`` at the first rejected position, or from
        ``p_{k+1}`` (the bonus token) when all k were accepted.

    Edge cases: ``q(x) = 0`` with ``p(x) > 0`` accepts (the ratio is infinite); ``p(x) = 0`` always
    rejects. A residual that is zero everywhere (p equal to q up to rounding, so a rejection had
    probability ~0) falls back to sampling from p, which is then the same distribution.

    This is :func:`speculative_sample_tree` on the chain (:func:`chain_parents`): with one child per node,
    SpecInfer's walk is Algorithm 1, so chains and trees share one implementation of the rule.

    Raises:
        ValueError: the shapes do not agree.
    """
    _check_shapes(draft_tokens, target_probs)
    bsz, k = draft_tokens.shape
    if draft_probs is not None and draft_probs.shape != (bsz, k, target_probs.shape[-1]):
        raise ValueError(f"draft_probs has shape {tuple(draft_probs.shape)}, expected {(bsz, k, target_probs.shape[-1])}")
    num_accepted, _, next_token = speculative_sample_tree(
        draft_tokens, chain_parents(bsz, k, draft_tokens.device), draft_probs, target_probs, generator, num_drafted)
    return num_accepted, next_token


def chain_parents(bsz: int, k: int, device=None) -> torch.Tensor:
    """A chain of k drafted tokens as a draft tree, for :func:`greedy_accept_tree` and :func:`speculative_sample_tree`.

    Args:
        bsz: B, the rows.
        k: the nodes (drafted tokens) per row, >= 0.
        device: the tensor's device.

    Returns:
        ``LongTensor[B, k]`` (an expanded view, read-only): node j's parent is node j - 1, node 0's is the root (-1).
    """
    return torch.arange(-1, k - 1, device=device).expand(bsz, k)


def _residual(p: torch.Tensor, q: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """What is left of ``p [B, V]`` after drafted tokens ``x [B]`` drawn from ``q [B, V]`` (``None``: one-hot at x)
    were rejected: ``normalize(max(p - q, 0))``; ``p`` itself where that is zero everywhere (p equal to q up to
    rounding, so a rejection had probability ~0 and p is then the same distribution)."""
    if q is None:
        residual = p.clone()
        residual[torch.arange(p.shape[0], device=p.device), x] = 0.0
    else:
        residual = (p - q).clamp(min=0.0)
    mass = residual.sum(dim=-1, keepdim=True)
    return torch.where(mass > 0, residual / mass.clamp(min=1e-30), p)


def _real(draft_tokens: torch.Tensor, num_drafted: torch.Tensor | None) -> torch.Tensor:
    """``BoolTensor[B, k]``: which draft columns are real."""
    if num_drafted is None:
        return torch.ones_like(draft_tokens, dtype=torch.bool)
    cols = torch.arange(draft_tokens.shape[1], device=draft_tokens.device)
    return cols[None, :] < num_drafted.to(draft_tokens.device)[:, None]


def _check_shapes(draft_tokens: torch.Tensor, target: torch.Tensor) -> None:
    if draft_tokens.dim() != 2 or target.dim() != 3:
        raise ValueError(
            f"expected draft_tokens [B, k] and target scores [B, k+1, V], got {tuple(draft_tokens.shape)} "
            f"and {tuple(target.shape)}"
        )
    if target.shape[0] != draft_tokens.shape[0] or target.shape[1] != draft_tokens.shape[1] + 1:
        raise ValueError(
            f"target scores must cover k+1 = {draft_tokens.shape[1] + 1} positions for {draft_tokens.shape[0]} "
            f"rows, got shape {tuple(target.shape)}"
        )


# ---- trees ----------------------------------------------------------------------------------------------------
def tree_depths(parents: torch.Tensor, num_nodes: torch.Tensor | None = None) -> torch.Tensor:
    """Each node's depth in a batch of draft trees (a root child has depth 1).

    Args:
        parents: ``LongTensor[B, N]``: node j's parent node, ``-1`` for a child of the root (the root is the
            last token the target already verified). Nodes are in topological order: ``parents[b, j] < j``.
        num_nodes: optional ``LongTensor[B]`` in ``0..N``: row b's nodes from ``num_nodes[b]`` on are filler
            (their parents are not read).

    Returns:
        ``LongTensor[B, N]``: depths (filler nodes: 0).

    Raises:
        ValueError: a real node whose parent is not an earlier node or -1.
    """
    bsz, n = parents.shape
    real = check_parents(parents, num_nodes)
    depth = torch.zeros(bsz, n + 1, dtype=torch.long, device=parents.device)  # column 0: the root
    parents = torch.where(real, parents, -1)  # filler: never read
    for j in range(n):
        depth[:, j + 1] = torch.where(real[:, j], depth.gather(1, (parents[:, j:j + 1] + 1).clamp(min=0)).squeeze(1) + 1, 0)
    return depth[:, 1:]


def check_parents(parents: torch.Tensor, num_nodes: torch.Tensor | None = None) -> torch.Tensor:
    """Check that every real node's parent is -1 (the root) or an earlier node (``parents [B, N]``; ``num_nodes``
    as in :func:`tree_depths`) and return which nodes are real (``BoolTensor[B, N]``).

    Raises:
        ValueError: the shape is not ``[B, N]``, or a real node's parent is neither -1 nor an earlier node.
    """
    if parents.dim() != 2:
        raise ValueError(f"parents must be [B, N], got shape {tuple(parents.shape)}")
    real = _real(parents, num_nodes)
    bad = real & ((parents < -1) | (parents >= torch.arange(parents.shape[1], device=parents.device)))
    if bool(bad.any()):
        b, j = (int(v) for v in bad.nonzero()[0])
        raise ValueError(f"node {j} of row {b} has parent {int(parents[b, j])}: a node's parent must be -1 (the root) "
                         "or an earlier node (topological order)")
    return real


def _tree_lists(parents: torch.Tensor, real: torch.Tensor) -> tuple[list[list[int]], list[list[bool]], list[list[int]]]:
    """The acceptance walks' bookkeeping as Python lists (a few list operations a node, where a tensor operation per
    node costs more than the walk itself): ``(parents, real, depths)``, each ``[B][N]``; a filler node's parent
    reads -1 (never followed) and its depth 0, as in :func:`tree_depths`. ``parents`` already checked, ``real``
    from :func:`check_parents`."""
    parent_lists, reals = torch.where(real, parents, -1).tolist(), real.tolist()
    depths = []
    for ups, flags in zip(parent_lists, reals):
        depth = [0] * len(ups)
        for j, (up, r) in enumerate(zip(ups, flags)):
            depth[j] = (depth[up] + 1 if up >= 0 else 1) if r else 0
        depths.append(depth)
    return parent_lists, reals, depths


def _accepted(parents: list[list[int]], depths: list[list[int]], last: list[int], device
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The walk's result from Python lists: ``(num_accepted LongTensor[B], path LongTensor[B, D])``, the nodes from the
    root's child down to ``last[b]`` (``-1``: the root, an empty path) padded with -1, D the deepest real node's
    depth."""
    width = max((max(d) for d in depths if d), default=0)
    lengths, paths = [], []
    for ups, node in zip(parents, last):
        path = []
        while node >= 0:
            path.append(node)
            node = ups[node]
        lengths.append(len(path))
        paths.append(path[::-1] + [-1] * (width - len(path)))
    return (torch.tensor(lengths, dtype=torch.long, device=device),
            torch.tensor(paths, dtype=torch.long, device=device).view(len(last), width))


def _check_tree(tokens: torch.Tensor, parents: torch.Tensor, target: torch.Tensor | None) -> None:
    """Shapes of a tree and of the target's scores (``None``: scores computed per position, not checked here)."""
    if tokens.dim() != 2 or (target is not None and target.dim() != 3) or parents.shape != tokens.shape:
        raise ValueError(f"expected tokens [B, N], parents [B, N] and target scores [B, N+1, V], got "
                         f"{tuple(tokens.shape)}, {tuple(parents.shape)} and "
                         f"{None if target is None else tuple(target.shape)}")
    if target is not None and target.shape[:2] != (tokens.shape[0], tokens.shape[1] + 1):
        raise ValueError(f"target scores must cover N+1 = {tokens.shape[1] + 1} positions (the root, then each node) "
                         f"for {tokens.shape[0]} rows, got shape {tuple(target.shape)}")


def greedy_accept_tree(
    tokens: torch.Tensor, parents: torch.Tensor, target_scores: torch.Tensor, num_nodes: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Greedy verification of a draft tree: the longest root path whose every token is the target's argmax.

    Args:
        tokens: ``LongTensor[B, N]``, the drafted tokens (node j).
        parents: ``LongTensor[B, N]``, node j's parent (``-1``: the root), an earlier node.
        target_scores: ``Tensor[B, N+1, V]``: position 0 scores the token after the root (the last verified
            token), position j+1 the token after node j (a forward with a tree attention mask: each node sees
            the prefix and its ancestors).
        num_nodes: optional ``LongTensor[B]``: real nodes per row (the rest are filler, never accepted).

    Returns:
        ``(num_accepted, path, next_token)``: ``LongTensor[B]`` (the accepted path's length), ``LongTensor[B, D]``
        (its nodes from the root's child down, padded with -1; D = the deepest node's depth) and ``LongTensor[B]``
        (the target's argmax after the path: the correction or bonus token). Where siblings carry the same token,
        the deeper accepted path wins (ties: the earlier node). On a chain this is :func:`greedy_accept`.

    Raises:
        ValueError: the shapes do not agree, or a parent is not an earlier node.
    """
    _check_tree(tokens, parents, target_scores)
    n = tokens.shape[1]
    parent_lists, reals, depths = _tree_lists(parents, check_parents(parents, num_nodes))
    toks = tokens.tolist()
    last, following = [], []
    top = _Argmax(target_scores)  # on a CPU: the root's position, then those of accepted nodes only
    for b in range(len(toks)):
        ok = [True] + [False] * n  # position 0: the root
        best, best_score = -1, -1  # the deepest accepted node (the earliest among equals)
        for j in range(n):
            up = parent_lists[b][j] + 1
            if reals[b][j] and ok[up] and toks[b][j] == top(b, up):
                ok[j + 1] = True
                if depths[b][j] * (n + 1) - j > best_score:
                    best, best_score = j, depths[b][j] * (n + 1) - j
        last.append(best)
        following.append(top(b, best + 1))
    return (*_accepted(parent_lists, depths, last, tokens.device),
            torch.tensor(following, dtype=torch.long, device=tokens.device))


def speculative_sample_tree(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor | Callable[[int], torch.Tensor],
    generator: torch.Generator | None = None,
    num_nodes: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Multi-candidate (recursive) rejection sampling over a draft tree (SpecInfer, Miao et al. 2024, Algorithm 2).

    From the root, with ``p`` the target's distribution there, the children are tried in node order: child j
    (token x, drawn from ``q_j``) is accepted with probability ``min(1, p(x) / q_j(x))``, and the walk moves to it
    with ``p`` the target's distribution after it; a rejection replaces ``p`` by ``normalize(max(p - q_j, 0))``
    and the next child is tried. When no child is accepted (or the node has none: the bonus token), the next
    token is drawn from ``p``. Each try is one step of :func:`speculative_sample`'s rule against what is left of
    ``p``, so the emitted tokens are distributed as the target's own samples, whatever the tree's shape, provided
    each node's token was drawn from its ``q`` independently of its siblings (i.i.d. samples, repeats allowed) or
    chosen deterministically (``q`` one-hot: a repeated sibling token then has ``p(x) = 0`` and is rejected).

    Args:
        tokens: ``LongTensor[B, N]``, the drafted tokens.
        parents: ``LongTensor[B, N]``, node j's parent (``-1``: the root), an earlier node.
        draft_probs: ``Tensor[B, N, V]``, the distribution each node's token was drawn from (after the same logits
            processors as the target), or ``None`` for a deterministic drafter (one-hot q for every node).
        target_probs: ``Tensor[B, N+1, V]``: the target's processed distributions at the root (position 0) and
            after each node (position j+1); or a function ``j -> Tensor[B, V]`` giving position j's, called once
            for each position the walk reads (the root and each node it moves to), in order: the loop passes one
            on a CPU (:data:`LAZY_DEVICES`), where processing a position (top-p sorts the vocabulary) costs a few
            milliseconds and a walk reads 2-5 of a 17-node tree's positions.
        generator: optional ``torch.Generator`` for the uniform draws and the final sample.
        num_nodes: optional ``LongTensor[B]``: real nodes per row (the rest are filler, never tried).

    Returns:
        ``(num_accepted, path, next_token)`` as :func:`greedy_accept_tree`.

    Edge cases as :func:`speculative_sample`: ``q(x) = 0`` with ``p(x) > 0`` accepts, ``p(x) = 0`` rejects, and a
    residual that is zero everywhere falls back to the ``p`` it came from.

    Raises:
        ValueError: the shapes do not agree, or a parent is not an earlier node.
    """
    if isinstance(target_probs, torch.Tensor):
        _check_tree(tokens, parents, target_probs)
        target_probs = target_probs.float()
        column = lambda j: target_probs[:, j]  # noqa: E731
    else:
        _check_tree(tokens, parents, None)
        column = lambda j: target_probs(j).float()  # noqa: E731
    bsz, n = tokens.shape
    device = tokens.device
    real = check_parents(parents, num_nodes)
    p = column(0).clone()  # what is left of the target's distribution at cur
    if p.dim() != 2 or p.shape[0] != bsz:
        raise ValueError(f"the target's distribution at the root has shape {tuple(p.shape)}, expected [{bsz}, V]")
    if draft_probs is not None:
        if draft_probs.shape != (bsz, n, p.shape[-1]):
            raise ValueError(f"draft_probs has shape {tuple(draft_probs.shape)}, expected {(bsz, n, p.shape[-1])}")
        draft_probs = draft_probs.float()
    u = torch.rand((bsz, n), device=device, generator=generator)
    cur = torch.full((bsz,), -1, dtype=torch.long, device=device)  # the node the walk is at (-1: the root)
    # one pass in node order walks every row's tree: a node's children come after it, and once the walk moves
    # to a child, its later siblings no longer have cur as their parent
    for j in range(n):
        tried = real[:, j] & (parents[:, j] == cur)
        if not bool(tried.any()):
            continue
        x = tokens[:, j]
        p_x = p.gather(1, x[:, None]).squeeze(1)
        q_x = torch.ones_like(p_x) if draft_probs is None else draft_probs[:, j].gather(1, x[:, None]).squeeze(1)
        accept = tried & (u[:, j] * q_x < p_x)
        reject = tried & ~accept
        if bool(reject.any()):
            residual = _residual(p, None if draft_probs is None else draft_probs[:, j], x)
            p = residual if bool(reject.all()) else torch.where(reject[:, None], residual, p)
        if bool(accept.any()):
            cur = torch.where(accept, j, cur)
            following = column(j + 1)
            p = following if bool(accept.all()) else torch.where(accept[:, None], following, p)
    next_token = torch.multinomial(p / p.sum(dim=-1, keepdim=True), 1, generator=generator).squeeze(1)
    parent_lists, _, depths = _tree_lists(parents, real)
    return (*_accepted(parent_lists, depths, cur.tolist(), device), next_token)
