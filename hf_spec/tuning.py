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

import statistics
from typing import Callable, Sequence

import torch

from .device import clock
from .kernels import install_verify_linear, verify_linear
from .ragged import RaggedCache

__all__ = ["expected_tokens_per_step", "expected_speedup", "best_k", "conditional_acceptance", "in_loop_costs",
           "expected_speedups",
           "measure_forward_times", "measure_verify_cost", "measure_cost_ratio"]


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
    """The k in 1..k_max with the highest :func:`expected_speedup`, and that speedup; on a tie the largest such k
    (``hf-spec tune``, which measures, breaks ties toward the smallest)."""
    scores = [(expected_speedup(acceptance, k, cost_ratio, verify_cost), k) for k in range(1, k_max + 1)]
    speed, k = max(scores)
    return k, speed


def conditional_acceptance(stats) -> list[float]:
    """Per-position conditional acceptance a_i = P(draft token i accepted | tokens 1..i-1 accepted), from a
    :class:`~hf_spec.metrics.SpecStats`; a position the drafter left empty counts as a rejection (so an
    n-gram drafter that finds no match lowers a_1)."""
    return [a / r if r else 0.0 for a, r in zip(stats.accepted_per_position, stats.reached_per_position)]


def in_loop_costs(calls: Sequence[dict], t_plain: float, k_max: int) -> tuple[list[float], list[float]]:
    """The draft cost and verify cost of each k, as the decoding loop itself spent them.

    Args:
        calls: :attr:`hf_spec.adaptive.CycleK.calls` of a calibration run (drafted positions d ->
            ``[(draft_time_s, verify_time_s), ...]`` per generate call), warm-up calls left out.
        t_plain: T_1 in seconds, a plain decode step (e.g. the baseline's TPOT on the same prompts).
        k_max: the largest k to report.

    Returns:
        ``(c, verify)``: ``c[k - 1]`` = mean drafting seconds per drafted position in steps that drafted k,
        over T_1 (the draft's catch-up on accepted tokens, logits processing and bookkeeping included, which
        isolated forwards miss), for k = 1..k_max; ``verify[n - 1]`` = mean seconds of a verify step over n
        positions (forward and acceptance rule) over T_1, for n = 1..k_max+1 (``verify[0] = 1``). A k not
        seen takes the mean over all drafted positions; an n not seen, a line through the origin-anchored
        points that were (``T_verify(n)/T_1 = 1 + s (n - 1)``).

    Raises:
        ValueError: t_plain <= 0, or no step drafted anything.
    """
    if t_plain <= 0:
        raise ValueError(f"t_plain must be > 0 seconds, got {t_plain}")
    sums: dict[int, list[float]] = {}
    for call in calls:
        for d, times in call.items():
            s = sums.setdefault(d, [0.0, 0.0, 0])
            for draft_s, verify_s in times:
                s[0] += draft_s
                s[1] += verify_s
                s[2] += 1
    drafted = {d: s for d, s in sums.items() if d > 0 and s[2]}
    if not drafted:
        raise ValueError("no step drafted anything: nothing to measure the draft and verify cost from; give more "
                         "prompts or longer answers (hf-spec tune --per-category, --max-new-tokens)")
    per_position = sum(s[0] for s in drafted.values()) / sum(d * s[2] for d, s in drafted.items())
    c = [(drafted[k][0] / drafted[k][2] / k if k in drafted else per_position) / t_plain for k in range(1, k_max + 1)]
    seen = {d + 1: s[1] / s[2] / t_plain for d, s in drafted.items()}
    pts = [(n - 1, v - 1.0) for n, v in seen.items()]
    slope = max(0.0, sum(x * y for x, y in pts) / sum(x * x for x, _ in pts))
    verify = [1.0] + [seen.get(n, 1.0 + slope * (n - 1)) for n in range(2, k_max + 2)]
    return c, verify


def expected_speedups(acceptance, c: Sequence[float], verify: Sequence[float]) -> dict[int, float]:
    """:func:`expected_speedup` for k = 1..len(c), with a cost ratio per k (from :func:`in_loop_costs`)."""
    return {k: expected_speedup(acceptance, k, c[k - 1], verify) for k in range(1, len(c) + 1)}


@torch.no_grad()
def measure_forward_times(
    model, input_ids: torch.LongTensor, positions: Sequence[int], repeats: int = 5, use_verify_linear: bool = True,
    tree: bool = False,
) -> dict[int, float]:
    """Median wall time (seconds) of one forward of ``model`` over n new positions after a cache holding
    ``input_ids`` (``LongTensor[1, L]``, prefilled once), for each n in ``positions``: n = 1 is a decode step,
    n > 1 a verify forward. Each forward is the loop's own (:meth:`hf_spec.ragged.RaggedCache.forward`: its masks
    and the attention path measured for this machine, :mod:`hf_spec.kernels`). With ``use_verify_linear`` (float32
    CPU models), n > 1 runs inside :func:`~hf_spec.kernels.verify_linear`, as the loop does; without, through
    torch's ``F.linear``. With ``tree``, the n positions are the last accepted token and a binary tree of n - 1
    draft nodes under it (block slot i's parent is slot (i - 1) // 2, breadth first: a tree forward's cost depends
    on its node count and on the tree attention mask, hardly on its shape) instead of a chain. Every clock read
    waits for the device (:func:`hf_spec.device.clock`), so CUDA times are real.

    Raises:
        ValueError: what :class:`~hf_spec.ragged.RaggedCache` refuses (a model with layers other than full and
            sliding-window attention; a sliding-window model whose attention is not ``sdpa`` or ``eager``), and
            ``tree`` for a model whose attention implementation takes no custom 4D mask."""
    ragged = RaggedCache(model.config, 1, input_ids.device)
    ragged.forward(model, input_ids)
    length = torch.tensor([input_ids.shape[1]])
    if model.device.type == "cpu" and model.dtype == torch.float32:
        install_verify_linear(model)
    times = {}
    for n in positions:
        block = input_ids[:, -n:] if n <= input_ids.shape[1] else input_ids[:, :1].repeat(1, n)
        # block slot j's parent is slot (j - 1) // 2, which is node (j - 1) // 2 - 1 (-1: the root, slot 0)
        parents = torch.tensor([[(j - 1) // 2 - 1 for j in range(1, n)]], device=input_ids.device) \
            if tree and n > 1 else None
        runs = []
        for _ in range(repeats + 1):  # the first run warms up
            t0 = clock(model.device)
            with verify_linear(use_verify_linear and n > 1):
                ragged.forward(model, block, logits_to_keep=n, parents=parents)
            runs.append(clock(model.device) - t0)
            ragged.truncate(length)
        times[n] = statistics.median(runs[1:])
    return times


def measure_verify_cost(model, input_ids: torch.LongTensor, n_max: int = 13, repeats: int = 5) -> list[float]:
    """``[T_verify(n) / T_1 for n in 1..n_max]`` measured on this machine (the first entry is 1.0)."""
    times = measure_forward_times(model, input_ids, range(1, n_max + 1), repeats)
    return [times[n] / times[1] for n in range(1, n_max + 1)]


def measure_cost_ratio(target, draft, input_ids: torch.LongTensor, repeats: int = 5) -> float:
    """c: one draft decode step's time over one target decode step's time (same context)."""
    t_draft = measure_forward_times(draft, input_ids.to(draft.device), [1], repeats)[1]
    return t_draft / measure_forward_times(target, input_ids, [1], repeats)[1]
