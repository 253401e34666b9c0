"""The speedup model and the choice of k.

With per-position acceptance a_1..a_k (a_i = probability that drafted token i is accepted given that
tokens 1..i-1 were), one step emits on average ``1 + a_1 + a_1 a_2 + ... + a_1...a_k`` tokens (the +1 is
the correction or bonus token). It costs one verify forward over k+1 positions plus k draft steps:
``T_verify(k+1) / T_1 + k c`` in units of one plain decode step T_1, with c the draft/target cost ratio.

    speedup(k) = E[tokens per step] / (T_verify(k+1) / T_1 + k c)

With a constant acceptance a and a flat verify cost (T_verify(n) = T_1) this is the formula of Leviathan
et al. 2023 (Theorem 3.8 with the cost ratio of Section 3.4): ``(1 - a^(k+1)) / ((1 - a)(1 + k c))``.
On CPUs the verify cost is not flat (``docs/architecture.md``): pass the measured ratios.
"""

from __future__ import annotations

from typing import Callable, Sequence

__all__ = ["expected_tokens_per_step", "expected_speedup", "best_k"]


def _acceptance(acceptance: float | Sequence[float], k: int) -> list[float]:
    if isinstance(acceptance, (int, float)):
        rates = [float(acceptance)] * k
    else:
        rates = [float(a) for a in acceptance]
        if len(rates) < k:
            rates += [rates[-1] if rates else 0.0] * (k - len(rates))
    if any(not 0.0 <= a <= 1.0 for a in rates):
        raise ValueError(f"acceptance rates must lie in [0, 1], got {rates}")
    return rates[:k]


def expected_tokens_per_step(acceptance: float | Sequence[float], k: int) -> float:
    """Mean tokens emitted per target forward (bonus/correction included) with k drafted tokens.

    Args:
        acceptance: a constant rate, or per-position conditional rates (extended with the last value).
        k: drafted tokens per step (>= 0).
    """
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    total, run = 1.0, 1.0
    for a in _acceptance(acceptance, k):
        run *= a
        total += run
    return total


def expected_speedup(
    acceptance: float | Sequence[float],
    k: int,
    cost_ratio: float,
    verify_cost: Callable[[int], float] | Sequence[float] | None = None,
) -> float:
    """Predicted speedup over plain decoding.

    Args:
        acceptance: constant or per-position conditional acceptance rates.
        k: drafted tokens per step (>= 0; 0 is plain decoding, speedup 1 with a flat verify cost).
        cost_ratio: c, one draft step's time over one target decode step's time (0 for n-gram lookup).
        verify_cost: T_verify(n) / T_1 for n positions: a function of n, or a sequence indexed by n - 1
            (n = 1..); ``None`` means flat (1.0 for every n).

    Returns:
        ``E[tokens per step] / (T_verify(k+1)/T_1 + k c)``.
    """
    if cost_ratio < 0:
        raise ValueError(f"cost_ratio must be >= 0, got {cost_ratio}")
    if verify_cost is None:
        v = 1.0
    elif callable(verify_cost):
        v = float(verify_cost(k + 1))
    else:
        if len(verify_cost) < k + 1:
            raise ValueError(f"verify_cost covers {len(verify_cost)} positions, need {k + 1}")
        v = float(verify_cost[k])
    return expected_tokens_per_step(acceptance, k) / (v + k * cost_ratio)


def best_k(
    acceptance: float | Sequence[float],
    cost_ratio: float,
    verify_cost: Callable[[int], float] | Sequence[float] | None = None,
    k_max: int = 12,
) -> tuple[int, float]:
    """The k in 1..k_max with the highest :func:`expected_speedup`, and that speedup."""
    scores = [(expected_speedup(acceptance, k, cost_ratio, verify_cost), k) for k in range(1, k_max + 1)]
    speed, k = max(scores)
    return k, speed
