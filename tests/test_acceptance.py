"""Unit tests of the shared acceptance rule (pure tensor functions), with statistical tests that have
teeth: the same test rejects deliberately wrong rules."""

import pytest
import torch
from scipy.stats import chisquare

from hf_spec.acceptance import greedy_accept, speculative_sample

ALPHA = 1e-4  # false-alarm rate of each chi-square test below


def test_greedy_accepts_longest_matching_prefix():
    V = 10
    draft = torch.tensor([[3, 4, 5], [3, 9, 5], [7, 7, 7]])
    target = torch.full((3, 4, V), -1.0)
    for row, toks in enumerate([[3, 4, 5, 6], [3, 4, 5, 6], [1, 2, 3, 4]]):
        for i, t in enumerate(toks):
            target[row, i, t] = 1.0
    n, nxt = greedy_accept(draft, target)
    assert n.tolist() == [3, 1, 0]
    assert nxt.tolist() == [6, 4, 1]  # bonus token, correction, correction


def test_greedy_with_empty_draft_is_plain_argmax():
    target = torch.randn(2, 1, 7)
    n, nxt = greedy_accept(torch.empty(2, 0, dtype=torch.long), target)
    assert n.tolist() == [0, 0]
    assert nxt.tolist() == target[:, 0].argmax(-1).tolist()


def test_shape_errors():
    with pytest.raises(ValueError, match="k\\+1"):
        greedy_accept(torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 3, 5))
    with pytest.raises(ValueError, match="draft_probs"):
        speculative_sample(torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 3, 5), torch.ones(1, 3, 5))


def _position_model(V=8, k=3, seed=0):
    """Target and draft distributions that depend on the position only (a valid language model)."""
    torch.manual_seed(seed)
    p = torch.distributions.Dirichlet(torch.full((V,), 0.6)).sample((k + 1,))
    q = torch.distributions.Dirichlet(torch.full((V,), 0.6)).sample((k,))
    # make them disagree strongly somewhere so that a wrong rule shows
    q[0] = q[0].flip(0)
    return p, q


def _emitted(rule, p, q, N, one_hot=False, seed=1):
    """Run one speculative step for N independent rows; return (first token, second token or -1)."""
    torch.manual_seed(seed)
    k, V = q.shape
    if one_hot:
        # deterministic drafter (the n-gram case): always proposes the same tokens, q is one-hot
        draft = p[:k].argmax(-1).expand(N, k).clone()
        qb = None
    else:
        draft = torch.stack([torch.multinomial(q[i], N, replacement=True) for i in range(k)], dim=1)
        qb = q.expand(N, k, V)
    n, nxt = rule(draft, qb, p.expand(N, k + 1, V))
    seq = torch.cat([draft, torch.zeros(N, 1, dtype=torch.long)], dim=1)
    seq[torch.arange(N), n] = nxt
    second = torch.where(n >= 1, seq[:, 1], torch.full_like(n, -1))
    return seq[:, 0], second


def _chi2_pvalue(tokens, probs):
    V = probs.numel()
    counts = torch.bincount(tokens, minlength=V).double()
    expected = probs.double() * counts.sum()
    keep = expected > 5
    obs, exp = counts[keep], expected[keep]
    exp = exp * obs.sum() / exp.sum()
    assert counts[~keep].sum() <= 5 + 3 * expected[~keep].sum().sqrt() + expected[~keep].sum()
    return chisquare(obs.numpy(), exp.numpy()).pvalue


def wrong_residual_rule(draft, q, p, generator=None, num_drafted=None):
    """Accept like Algorithm 1, but resample from p instead of the residual max(p - q, 0)."""
    n, nxt = speculative_sample(draft, q, p, generator, num_drafted)
    k = draft.shape[1]
    rows = torch.arange(draft.shape[0])
    redo = n < (k if num_drafted is None else num_drafted)
    nxt[redo] = torch.multinomial(p[rows[redo], n[redo]], 1).squeeze(1)
    return n, nxt


def wrong_residual(p, q, x):
    """The same wrong rule as the loop's residual (``hf_spec.acceptance._residual``, which chains and trees share):
    after a rejection the next token is drawn from p, not from normalize(max(p - q, 0))."""
    return p


def wrong_ratio_rule(draft, q, p, generator=None):
    """Accept every drafted token whose target probability is above 1/V (a plausible-looking bug)."""
    k = draft.shape[1]
    px = p[:, :k].gather(-1, draft[..., None]).squeeze(-1)
    n = (px > 1.0 / p.shape[-1]).long().cumprod(-1).sum(-1)
    rows = torch.arange(draft.shape[0])
    nxt = torch.multinomial(p[rows, n], 1).squeeze(1)
    return n, nxt


@pytest.mark.parametrize("one_hot", [False, True])
def test_speculative_sampling_matches_target_distribution(one_hot):
    p, q = _position_model()
    first, second = _emitted(speculative_sample, p, q, N=200_000, one_hot=one_hot)
    assert _chi2_pvalue(first, p[0]) > ALPHA
    sec = second[second >= 0]
    assert sec.numel() > 10_000
    assert _chi2_pvalue(sec, p[1]) > ALPHA


@pytest.mark.parametrize("rule", [wrong_residual_rule, wrong_ratio_rule])
def test_the_statistical_test_rejects_wrong_rules(rule):
    p, q = _position_model()
    first, _ = _emitted(rule, p, q, N=200_000)
    assert _chi2_pvalue(first, p[0]) < ALPHA


def test_q_zero_accepts_and_p_zero_rejects():
    p = torch.tensor([[[0.0, 0.5, 0.5, 0.0], [0.25] * 4]])
    q_zero = torch.tensor([[[0.0, 0.0, 1.0, 0.0]]])  # draft token 1 has q = 0 but p = 0.5
    n, _ = speculative_sample(torch.tensor([[1]]), q_zero, p)
    assert n.item() == 1
    for _ in range(50):  # p(x) = 0: always rejected, and the replacement is never x
        n, nxt = speculative_sample(torch.tensor([[0]]), torch.tensor([[[1.0, 0, 0, 0]]]), p)
        assert n.item() == 0 and nxt.item() in (1, 2)


def test_zero_residual_falls_back_to_target():
    # q puts (slightly) more mass than p on every token: max(p - q, 0) == 0 everywhere
    p = torch.tensor([[[0.3, 0.7], [0.5, 0.5]]]).expand(50_000, 2, 2)
    q = torch.tensor([[[0.3 + 1e-2, 0.7 + 1e-2]]]).expand(50_000, 1, 2)
    torch.manual_seed(0)
    draft = torch.ones(50_000, 1, dtype=torch.long)
    n, nxt = speculative_sample(draft, q, p)
    rejected = n == 0
    assert rejected.sum() > 100  # p/q = 0.986 for token 1
    assert torch.isin(nxt, torch.tensor([0, 1])).all()


def test_generator_makes_sampling_reproducible():
    p = torch.softmax(torch.randn(3, 4, 11), -1)
    q = torch.softmax(torch.randn(3, 3, 11), -1)
    d = torch.randint(0, 11, (3, 3))
    a = speculative_sample(d, q, p, torch.Generator().manual_seed(5))
    b = speculative_sample(d, q, p, torch.Generator().manual_seed(5))
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_filler_columns_are_never_accepted_and_the_next_token_comes_from_the_target():
    """Rows that drafted fewer tokens (num_drafted) pad with filler; a filler equal to the target's
    argmax must still not be accepted, and the row's next token is the target's token at num_drafted."""
    V = 6
    target = torch.full((2, 4, V), -1.0)
    for row in range(2):
        for i, t in enumerate([2, 3, 4, 5]):
            target[row, i, t] = 1.0
    draft = torch.tensor([[2, 3, 4], [2, 3, 4]])  # row 1: only 1 real token, fillers happen to match
    n, nxt = greedy_accept(draft, target, torch.tensor([3, 1]))
    assert n.tolist() == [3, 1] and nxt.tolist() == [5, 3]
    p = target.softmax(-1)
    n, nxt = speculative_sample(draft, None, p * 0 + torch.nn.functional.one_hot(target.argmax(-1), V).float(),
                                num_drafted=torch.tensor([3, 1]))
    assert n.tolist() == [3, 1] and nxt.tolist() == [5, 3]


def test_sampling_after_a_short_draft_is_from_p_not_the_residual():
    """A row whose draft ran out (all its real tokens accepted) draws the next token from p at that
    position (the bonus distribution), never from a residual built with a filler token."""
    V, N = 4, 20000
    torch.manual_seed(0)
    p = torch.tensor([0.1, 0.2, 0.3, 0.4]).expand(N, 2, V)
    draft = torch.full((N, 1), 3)  # filler column (num_drafted = 0) equal to the likeliest token
    n, nxt = speculative_sample(draft, None, p, num_drafted=torch.zeros(N, dtype=torch.long))
    assert int(n.sum()) == 0
    counts = torch.bincount(nxt, minlength=V).tolist()
    assert chisquare(counts, [N * x for x in (0.1, 0.2, 0.3, 0.4)]).pvalue > ALPHA
