"""The tree acceptance rules (hf_spec.acceptance.greedy_accept_tree / speculative_sample_tree): greedy walks the
longest matching root path; recursive rejection sampling (SpecInfer) keeps the target's distribution for trees of
several shapes, sampled or deterministic drafts, repeated sibling tokens, and a wrong rule fails the same test."""

import pytest
import torch
from scipy.stats import chisquare

from hf_spec import acceptance
from hf_spec.acceptance import (greedy_accept, greedy_accept_tree, speculative_sample, speculative_sample_tree,
                                tree_depths)

ALPHA = 1e-4  # false-alarm rate of each chi-square test

#: tree shapes as parent lists: a chain, a wide root, a root with a deeper first branch, and siblings everywhere
SHAPES = {
    "chain": [-1, 0, 1],
    "wide": [-1, -1, -1, 0],
    "branchy": [-1, -1, 0, 0, 2, 1],
}


def test_depths_and_bad_parents():
    assert tree_depths(torch.tensor([[-1, 0, 0, 1, -1]])).tolist() == [[1, 2, 2, 3, 1]]
    assert tree_depths(torch.tensor([[-1, 0, 9]]), num_nodes=torch.tensor([2])).tolist() == [[1, 2, 0]]
    for bad in ([0, -1], [-1, 1], [-1, -2]):
        with pytest.raises(ValueError, match="earlier node"):
            tree_depths(torch.tensor([bad]))
    with pytest.raises(ValueError, match="N\\+1"):
        greedy_accept_tree(torch.zeros(1, 2, dtype=torch.long), torch.tensor([[-1, 0]]), torch.zeros(1, 2, 5))


def test_greedy_tree_on_chains_is_greedy_accept():
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        bsz, k, V = 4, 5, 3  # a small vocabulary: many matches
        draft = torch.randint(V, (bsz, k), generator=g)
        scores = torch.randn(bsz, k + 1, V, generator=g)
        num_drafted = torch.randint(k + 1, (bsz,), generator=g)
        n, nxt = greedy_accept(draft, scores, num_drafted)
        parents = torch.arange(-1, k - 1).expand(bsz, k)
        n_t, path, nxt_t = greedy_accept_tree(draft, parents, scores, num_drafted)
        assert n_t.tolist() == n.tolist() and nxt_t.tolist() == nxt.tolist()
        for b in range(bsz):
            assert path[b, :n[b]].tolist() == list(range(int(n[b]))) and (path[b, n[b]:] == -1).all()


@pytest.mark.parametrize("lazy", [True, False], ids=["lazy (CPU)", "all at once (other devices)"])
def test_greedy_rules_match_a_reference_on_random_trees_with_tied_scores(monkeypatch, lazy):
    """Both greedy rules read the target's argmax only where their walk gets to on a CPU, all at once elsewhere;
    against a reference that takes every position's argmax at once (ties: the first maximum) and checks each node's
    whole root path."""
    monkeypatch.setattr(acceptance._Argmax, "lazy_devices", ("cpu",) if lazy else ())
    g = torch.Generator().manual_seed(1)
    for _ in range(300):
        bsz, n, V = 3, int(torch.randint(0, 9, (1,), generator=g)), 3
        parents = torch.tensor([[int(torch.randint(-1, j, (1,), generator=g)) if j else -1 for j in range(n)]
                                for _ in range(bsz)], dtype=torch.long).reshape(bsz, n)
        tokens = torch.randint(V, (bsz, n), generator=g)
        scores = torch.randint(0, 3, (bsz, n + 1, V), generator=g).float()  # integer scores: many ties
        num_nodes = torch.randint(n + 1, (bsz,), generator=g)
        argmax = scores.argmax(dim=-1)
        got_n, got_path, got_next = greedy_accept_tree(tokens, parents, scores, num_nodes)
        for b in range(bsz):
            def root_path(j):
                return [] if j < 0 else root_path(int(parents[b, j])) + [j]
            valid = [j for j in range(int(num_nodes[b]))
                     if all(tokens[b, p] == argmax[b, int(parents[b, p]) + 1] for p in root_path(j))]
            best = max(valid, key=lambda j: (len(root_path(j)), -j), default=-1)
            assert got_n[b] == len(root_path(best)) and got_next[b] == argmax[b, best + 1]
            assert got_path[b, :len(root_path(best))].tolist() == root_path(best)
        if n:  # the chain rule on the same scores, against the same reference
            chain_n, chain_next = greedy_accept(tokens, scores, num_nodes)
            for b in range(bsz):
                m = 0
                while m < int(num_nodes[b]) and tokens[b, m] == argmax[b, m]:
                    m += 1
                assert (int(chain_n[b]), int(chain_next[b])) == (m, int(argmax[b, m]))


def test_greedy_tree_takes_the_deepest_matching_path():
    # root children 0 and 2 carry the same token; only 2's child matches the target after it
    tokens = torch.tensor([[5, 7, 5, 8, 9]])
    parents = torch.tensor([[-1, 0, -1, 2, -1]])
    scores = torch.zeros(1, 6, 10)
    for pos, tok in [(0, 5), (1, 3), (3, 8), (4, 4)]:
        scores[0, pos, tok] = 1.0
    n, path, nxt = greedy_accept_tree(tokens, parents, scores)
    assert (n.item(), path.tolist(), nxt.item()) == (2, [[2, 3]], 4)
    # no child matches: nothing accepted, the target's argmax at the root
    scores[0, 0] = 0.0
    scores[0, 0, 1] = 1.0
    n, path, nxt = greedy_accept_tree(tokens, parents, scores)
    assert (n.item(), path.tolist(), nxt.item()) == (0, [[-1, -1]], 1)
    # filler nodes are never accepted
    scores[0, 0, 1] = 0.0
    scores[0, 0, 9] = 1.0
    n, _, _ = greedy_accept_tree(tokens, parents, scores, num_nodes=torch.tensor([4]))
    assert n.item() == 0


def _markov(V=5, depth=4, seed=0):
    """Target p and draft q of a Markov language model: ``table[d][prev]`` is the distribution at depth d after
    token prev (d = 0: the root's distribution, in row 0). They disagree strongly, so a wrong rule shows."""
    g = torch.Generator().manual_seed(seed)
    dirichlet = lambda: torch.distributions.Dirichlet(torch.full((V,), 0.7)).sample((depth, V))  # noqa: E731
    torch.manual_seed(seed)
    p, q = dirichlet(), dirichlet()
    q[0, 0] = q[0, 0].flip(0)
    return p, q


def _tree_step(rule, shape, p, q, N, mode, seed=1):
    """One verify step for N rows drafting the tree ``shape`` from q; returns the first two emitted tokens (the
    second drawn from the target where the step emitted one token, as the next step would)."""
    torch.manual_seed(seed)
    parents = torch.tensor(SHAPES[shape]).expand(N, -1)
    n_nodes, V = parents.shape[1], p.shape[-1]
    depth = tree_depths(parents)
    tokens = torch.zeros(N, n_nodes, dtype=torch.long)
    qs = torch.zeros(N, n_nodes, V)
    rank = torch.zeros(N, n_nodes, dtype=torch.long)  # a node's index among its siblings
    for j in range(n_nodes):
        prev = torch.zeros(N, dtype=torch.long) if SHAPES[shape][j] < 0 else tokens[:, SHAPES[shape][j]]
        qs[:, j] = q[depth[0, j] - 1, prev] if SHAPES[shape][j] >= 0 else q[0, 0].expand(N, V)
        rank[:, j] = sum(1 for i in range(j) if SHAPES[shape][i] == SHAPES[shape][j])
        if mode == "sampled":  # i.i.d. from q: repeated siblings happen
            tokens[:, j] = torch.multinomial(qs[:, j], 1).squeeze(1)
        elif mode == "top":  # deterministic: the siblings are q's top tokens, in order
            tokens[:, j] = qs[:, j].argsort(dim=-1, descending=True).gather(1, rank[:, j:j + 1]).squeeze(1)
        else:  # "repeat": deterministic, every sibling the same token
            tokens[:, j] = qs[:, j].argmax(dim=-1)
    target = torch.zeros(N, n_nodes + 1, V)
    target[:, 0] = p[0, 0]
    for j in range(n_nodes):
        target[:, j + 1] = p[depth[0, j], tokens[:, j]]
    n, path, nxt = rule(tokens, parents, qs if mode == "sampled" else None, target)
    rows = torch.arange(N)
    first = torch.where(n >= 1, tokens[rows, path[:, 0].clamp(min=0)], nxt)
    second_node = path[:, 1].clamp(min=0) if path.shape[1] > 1 else torch.zeros_like(n)
    second = torch.where(n >= 2, tokens[rows, second_node], nxt)
    fresh = torch.multinomial(p[1, first], 1).squeeze(1)
    second = torch.where(n >= 1, second, fresh)
    return first, second


def _pvalue(tokens, probs):
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    expected = probs.double().flatten() * counts.sum()
    keep = expected > 5
    assert counts[~keep].sum() <= 5 + 3 * expected[~keep].sum().sqrt() + expected[~keep].sum()
    obs, exp = counts[keep], expected[keep]
    return chisquare(obs.numpy(), (exp * obs.sum() / exp.sum()).numpy()).pvalue


def wrong_sibling_rule(tokens, parents, draft_probs, target_probs, generator=None, num_nodes=None):
    """Tries each sibling against the target's full p, not what earlier rejections left of it (a plausible bug:
    the first token is then too likely to be one the draft proposes)."""
    column = target_probs if callable(target_probs) else (lambda j: target_probs[:, j])  # the loop's, lazy on a CPU
    bsz, n = tokens.shape
    cur = torch.full((bsz,), -1, dtype=torch.long)
    p = column(0).clone()
    for j in range(n):
        tried = parents[:, j] == cur
        x = tokens[:, j]
        q_x = torch.ones(bsz) if draft_probs is None else draft_probs[:, j].gather(1, x[:, None]).squeeze(1)
        accept = tried & (torch.rand(bsz) * q_x < p.gather(1, x[:, None]).squeeze(1))
        cur = torch.where(accept, j, cur)
        p = torch.where(accept[:, None], column(j + 1), p)
    nxt = torch.multinomial(p, 1).squeeze(1)
    ups, _, depths = acceptance._tree_lists(parents, torch.ones_like(parents, dtype=torch.bool))
    return (*acceptance._accepted(ups, depths, cur.tolist(), cur.device), nxt)


@pytest.mark.parametrize("shape,mode", [("chain", "sampled"), ("wide", "sampled"), ("branchy", "sampled"),
                                        ("wide", "top"), ("branchy", "top"), ("wide", "repeat")])
def test_tree_sampling_keeps_the_target_distribution(shape, mode):
    p, q = _markov()
    first, second = _tree_step(speculative_sample_tree, shape, p, q, N=120_000, mode=mode)
    assert _pvalue(first, p[0, 0]) > ALPHA
    joint = p[0, 0][:, None] * p[1]  # p(x1) p(x2 | x1)
    assert _pvalue(first * p.shape[-1] + second, joint) > ALPHA


@pytest.mark.parametrize("mode", ["sampled", "top"])
def test_the_statistical_test_rejects_a_wrong_sibling_rule(mode):
    p, q = _markov()
    first, second = _tree_step(wrong_sibling_rule, "wide", p, q, N=120_000, mode=mode)
    joint = p[0, 0][:, None] * p[1]
    assert min(_pvalue(first, p[0, 0]), _pvalue(first * p.shape[-1] + second, joint)) < ALPHA


def test_tree_sampling_on_a_chain_matches_the_chain_rule():
    """A chain through speculative_sample_tree gives the chain rule's distribution of (accepted, next)."""
    g = torch.Generator().manual_seed(3)
    N, k, V = 60_000, 2, 4
    p = torch.distributions.Dirichlet(torch.full((V,), 0.7)).sample((k + 1,))
    q = torch.distributions.Dirichlet(torch.full((V,), 0.7)).sample((k,))
    draft = torch.stack([torch.multinomial(q[i], N, replacement=True, generator=g) for i in range(k)], dim=1)
    n1, x1 = speculative_sample(draft, q.expand(N, k, V), p.expand(N, k + 1, V), generator=g)
    n2, _, x2 = speculative_sample_tree(draft, torch.arange(-1, k - 1).expand(N, k), q.expand(N, k, V),
                                        p.expand(N, k + 1, V), generator=g)
    a = torch.bincount(n1 * V + x1, minlength=(k + 1) * V).double()
    b = torch.bincount(n2 * V + x2, minlength=(k + 1) * V).double()
    keep = (a + b) > 10
    from scipy.stats import chi2_contingency
    assert chi2_contingency(torch.stack([a[keep], b[keep]]).numpy()).pvalue > ALPHA


def test_tree_sampling_reads_positions_lazily_with_the_same_result():
    """target_probs as a function of the position (the loop's form on a CPU): the same (accepted, path, next) as
    the tensor under the same generator, on random trees, batches and filler; it is asked for the root and the
    positions after the nodes some row's walk moved to (its accepted path), each once, and for nothing else."""
    g = torch.Generator().manual_seed(11)
    for _ in range(100):
        bsz, n, V = 3, 6, 4
        parents = torch.tensor([[int(torch.randint(-1, j, (1,), generator=g)) for j in range(n)] for _ in range(bsz)])
        tokens = torch.randint(V, (bsz, n), generator=g)
        probs = torch.distributions.Dirichlet(torch.full((V,), 0.5)).sample((bsz, n + 1))
        q = torch.distributions.Dirichlet(torch.full((V,), 0.5)).sample((bsz, n)) if _ % 2 else None
        num_nodes = torch.randint(n + 1, (bsz,), generator=g)
        seed = int(torch.randint(1 << 30, (1,), generator=g))
        eager = speculative_sample_tree(tokens, parents, q, probs, torch.Generator().manual_seed(seed), num_nodes)
        asked = []
        lazy = speculative_sample_tree(tokens, parents, q, lambda j: asked.append(j) or probs[:, j],
                                       torch.Generator().manual_seed(seed), num_nodes)
        assert [t.tolist() for t in lazy] == [t.tolist() for t in eager]
        num, path = eager[0], eager[1]
        walked = {0} | {int(path[b, i]) + 1 for b in range(bsz) for i in range(int(num[b]))}
        assert asked[0] == 0 and len(asked) == len(set(asked)) and set(asked) == walked


def test_tree_sampling_edge_cases():
    # q(x) = 0 with p(x) > 0 accepts; p(x) = 0 rejects and the residual excludes the rejected token
    tokens, parents = torch.tensor([[1, 2]]), torch.tensor([[-1, -1]])
    target = torch.tensor([[[0.0, 0.5, 0.0, 0.5], [0.25] * 4, [0.25] * 4]])
    q = torch.zeros(1, 2, 4)
    q[0, :, 0] = 1.0
    for _ in range(20):
        n, path, _ = speculative_sample_tree(tokens, parents, q, target)
        assert n.item() == 1 and path.tolist() == [[0]]
    for _ in range(20):  # one-hot: token 2 has p = 0 and is rejected; token 1 accepted half the time
        n, path, nxt = speculative_sample_tree(torch.tensor([[2, 2]]), parents, None, target)
        assert n.item() == 0 and nxt.item() in (1, 3)
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    args = (torch.tensor([[1, 3, 0]]), torch.tensor([[-1, -1, 0]]), None, torch.full((1, 4, 4), 0.25))
    assert [t.tolist() for t in speculative_sample_tree(*args, generator=g1)] == \
        [t.tolist() for t in speculative_sample_tree(*args, generator=g2)]


def test_filler_nodes_are_never_read():
    tokens, parents = torch.tensor([[4, 4, 4]]), torch.tensor([[-1, 0, 17]])  # node 2 is filler with a bad parent
    scores = torch.zeros(1, 4, 6)
    scores[:, :, 4] = 1.0
    n, path, nxt = greedy_accept_tree(tokens, parents, scores, num_nodes=torch.tensor([2]))
    assert (n.item(), path.tolist(), nxt.item()) == (2, [[0, 1]], 4)
    n, path, _ = speculative_sample_tree(tokens, parents, None, scores.softmax(-1) * 0 + torch.eye(6)[4],
                                         num_nodes=torch.tensor([2]))
    assert (n.item(), path.tolist()) == (2, [[0, 1]])


def test_an_empty_tree_is_a_plain_step():
    """N = 0 nodes (a drafter with nothing to propose for any row, e.g. the suffix drafter without a match):
    nothing accepted, and the token after the root is the target's (its argmax; a sample from p)."""
    tokens, parents = torch.zeros(2, 0, dtype=torch.long), torch.zeros(2, 0, dtype=torch.long)
    scores = torch.tensor([[[0.0, 3.0, 1.0]], [[2.0, 0.0, 1.0]]])
    n, path, nxt = greedy_accept_tree(tokens, parents, scores)
    assert (n.tolist(), tuple(path.shape), nxt.tolist()) == ([0, 0], (2, 0), [1, 0])
    probs = torch.tensor([[[0.0, 1.0, 0.0]], [[0.0, 0.0, 1.0]]])
    n, path, nxt = speculative_sample_tree(tokens, parents, None, probs)
    assert (n.tolist(), tuple(path.shape), nxt.tolist()) == ([0, 0], (2, 0), [1, 2])
