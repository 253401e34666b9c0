"""Adaptive k and the on/off policy: ``num_speculative_tokens="auto"``.

:class:`AdaptiveK` listens to the loop's :class:`~hf_spec.events.StepEvent` s and keeps running estimates of

- the conditional acceptance a_i of each draft position (exponentially decayed counts, so it follows a
  change of text or temperature; a step decays only the positions it could observe, so positions beyond
  the k in use keep what was last seen there, and each estimate is shrunk towards the one of the position
  before, so that positions not yet seen start from it);
- T_1, the time of a plain decode step (a target forward over one position per row), measured on plain
  steps: the first ``plain_steps`` (3) decode steps are plain, so are steps with speculation off and n-gram
  steps that found no match; and while speculation is on, one step in ``refresh_steps`` (64) without any
  plain step is made plain to measure it again: a start measured on a slow moment would otherwise make
  every step look cheap for as long as speculation stays on, and T_1 grows with the context. T_1 is a
  property of the target, the device, the batch size and the context length, not of the text, so the loop
  keeps the last ``window`` plain-step times of each call (:func:`remember_plain_times`, per target object,
  batch size and power-of-two bucket of the prompt length, in this process) and starts the next such call's
  estimate from them (:meth:`AdaptiveK.start_from`): it speculates from its first decode step, where the 3
  plain steps were a large share of a short answer (docs/benchmarks.md);
- the whole cost of a speculative step at each k used so far (drafting plus verifying, everything the loop
  spends between two steps: a draft model catching up on the tokens it has not seen, logits processing,
  n-gram misses), and for the k not used yet a model of it: a verify forward over n positions on a line
  ``T_verify(n)/T_1 = 1 + s (n - 1)`` fitted through the n seen, plus drafting ``c_0 + k c`` (a per-step part
  and a per-token part, fitted through the k seen).

Times are medians of the last ``window`` measurements, so one-off costs (a draft model's prefill of the
prompt at its first draft, a cache reallocation) do not sway them. A k's steps that drafted and those that
did not (an n-gram drafter that found no match verifies one position: a plain step) have a median each,
weighted by how often steps drafted (over every k: whether a match exists does not depend on k): one median
over both would report the cheap mode while the expensive one costs, and keep speculation on where it loses
(measured: 2026-11-30, n-gram on a writing prompt, 28 steps at a_1 = 0.02 before switching off).

Before each step it picks the k in ``k_min..k_max`` with the highest predicted speedup
``E[tokens per step] / (step cost(k) / T_1)`` (:func:`~hf_spec.tuning.expected_tokens_per_step`: the model of
Leviathan et al. 2023 with measured costs), moving only when the gain beats a margin, so noise does not make
it thrash. For the k in use the step cost is measured, not modelled, so the prediction there is what the
last steps actually achieved (with smoothed acceptance): an optimistic model cannot keep speculation on.

A drafter that ends its drafts where it doubts them (a draft model's confidence stop,
:attr:`~hf_spec.drafters.base.Drafter.stops_when_unsure`) speculates at its own k only
(:meth:`AdaptiveK.keep_drafter_k`): k is a cap there, the draft's length already follows the text, and the
controller only decides whether speculation pays. Measured (issue 21, 6 and 8 prompts): fixed k = 6 with the
stop beat auto started at k = 1 by 3-8% on the median of prompts.

A drafter is never judged by its smallest k alone. The first speculative steps use ``k_min`` (a first
judgment costs least there where the drafter loses, which matters on short answers: n-gram lookup on a
writing prompt, a_1 ~ 0.02, is off after 4 steps at k = 1); then larger k are measured for one dwell each,
once: the drafter's own k, then twice the largest k measured, up to ``k_max``, each when either of two
optimistic models of it predicts a gain over the best prediction and over plain decoding:

- while one k alone is measured: drafting costs per step what it costs now (a draft model with a large
  per-step cost, whatever k; once two k are measured, the line fitted through them prices drafting: an int8
  draft model at ~0.2 T_1 per token looked free per step to this model, and measuring k = 6 and k = 8 for 4
  steps each on prose that accepted 39% cost more than it found); skipped where even this cannot pay (an
  n-gram drafter on a short translation: 4 steps at k = 3 that accepted nothing cost 9% of an 18-token
  answer);
- only where no k is predicted to pay by the margin: a step at the larger k costs what a step at the
  largest k measured costs (an upper bound). This fires on high acceptance: the tokens a longer draft
  emits could pay for a per-step overhead that a model extrapolated from k = 1 charges once per drafted
  token. Measured (issue 21): on an AVX-512 Xeon in float32 a step at k = 1 cost 2.23 T_1 (a draft forward
  plus a verify forward far dearer than a plain step) and was predicted to lose (0.85x at a = 0.9); the
  previous controller switched off and probed k = 1 again and again, never measuring k = 3, which won with
  fixed k (draft model 1.06x, n-gram 1.40x, where auto reached 0.91x and 0.98x).

When even the best k is predicted slower than plain decoding (low acceptance, a high temperature flattening
the distributions, a batch large enough to make verification compute-bound, a drafter that costs more than
it saves), speculation is switched off and plain decoding continues; after ``off_steps`` steps it probes
again for ``dwell_steps`` steps and stays on if the prediction is back above 1, else switches off for twice
as long (up to ``max_off_steps``): hysteresis. A probe runs the k in use the last time speculation was
predicted to pay (it asks whether the text is back to what it was then; at a smaller k it would judge
the drafter by its worst k again), else the k that came closest; a probe may measure larger k as above.
Every change is recorded as the event's ``policy`` (``{"k", "reason", "predicted_speedup"}``), collected in
``SpecStats.policy_events`` and logged at DEBUG on the ``hf_spec`` logger.

A drafter's one-off catch-up (a draft model's prefill of a long prompt at its first draft) is judged apart,
before it is paid: :meth:`AdaptiveK.catch_up_pays` keeps speculation off where the tokens left before
``max_length`` cannot repay it.

The output does not depend on k: every k goes through the same acceptance rule, so greedy output stays
token-identical to the target's and sampled output keeps the target's distribution.
"""

from __future__ import annotations

import logging
import statistics
import threading
import weakref
from typing import NamedTuple

from .events import StepEvent
from .metrics import count_positions
from .tuning import expected_tokens_per_step

__all__ = ["AdaptiveK", "CycleK", "TreeSize", "forward_time", "make_controller", "remember_plain_times",
           "remembered_plain_times"]

logger = logging.getLogger("hf_spec")


def forward_time(times: dict[int, float], n: float) -> float:
    """A target forward's estimated time over ``n`` positions per row, from the times measured at some numbers of
    positions (``{positions: time}``, any unit; a plain step is 1 position): the time measured at n where n was
    seen, else the time of the nearest n seen below it plus a slope per extra position: least squares through
    the points seen, anchored at the smallest n seen (clamped at >= 0); below the smallest n seen, its time.
    :class:`AdaptiveK` prices a k it has not measured with it, the hybrid drafter each source's draft length.

    Raises:
        ValueError: ``times`` is empty.
    """
    if not times:
        raise ValueError("forward_time needs at least one measured time")
    if n in times:
        return times[n]
    lowest = min(times)
    if n <= lowest:
        return times[lowest]
    points = [(m - lowest, t - times[lowest]) for m, t in times.items() if m != lowest]
    slope = max(0.0, sum(x * y for x, y in points) / sum(x * x for x, _ in points)) if points else 0.0
    below = max(m for m in times if m < n)
    return times[below] + slope * (n - below)


class _Model(NamedTuple):
    """The estimates a decision rests on, computed once per step and shared by every k."""

    acceptance: list[float]  # conditional acceptance by position
    draft_line: tuple[float, float]  # (c_0, c_1) seconds
    p: float  # fraction of speculative steps that drafted (pooled over k)
    t_miss: float  # a step that drafted nothing, over T_1


class AdaptiveK:
    """Online choice of num_speculative_tokens, with speculation switched off where it does not pay.

    Args:
        k_min: the smallest k when speculating (``1 <= k_min <= k_max``).
        k_max: the largest k; also capped by the drafter (a Medusa checkpoint's head count).
        k_start: the k of the first speculative step (default ``k_min``). For a drafter that stops when unsure
            (a draft model with its confidence stop) neither applies: k is a cap there and stays the drafter's
            own (:meth:`keep_drafter_k`). Larger k are measured next (the drafter's own k, then twice the
            largest measured, when an optimistic model of them predicts a gain: the module docstring), so the
            cost model rests on measured k: a first judgment at the cheapest k costs least where the drafter
            loses (short answers), and a model fitted through one small k alone can extrapolate the cost of larger
            ones pessimistically (a per-step drafting or verify overhead, a concave verify cost: the unit tests'
            synthetic drafters).
        decay: per-step weight kept by past acceptance counts (0 < decay < 1; 0.97 ~ the last 33 steps).
        window: T_1, T_verify(n) and the step times are medians of this many latest measurements
            (``>= plain_steps``).
        margin: a new k must be predicted faster than the current one by this fraction to be taken
            (``0 <= margin < 1``).
        off_below: speculation switches off when the best k's predicted speedup is under
            ``off_below * (1 - margin)``; a probe stays on only at ``off_below`` or more.
        off_steps: plain steps before the first probe; doubled after each failed probe up to
            ``max_off_steps``, reset when a probe succeeds.
        plain_steps: decode steps at the start that are plain, to measure T_1 (one step's time varies by
            ~10% on a busy CPU; their median is the start value); fewer, or none, where the call starts with
            plain-step times of an earlier call (:meth:`start_from`).
        refresh_steps: after this many speculative steps without a plain one, one step is plain, to measure
            T_1 again (a ``"refresh"`` policy record): costs ~1/refresh_steps of the gain.
        dwell_steps: steps a new k (or a probe, made at the k that last paid, else the k that came closest
            when switching off) is kept and measured before the next decision: the smoothing that stops
            thrashing, with ``margin`` and the decayed counts.

    Raises:
        ValueError: a bound or setting out of range (NaN included).

    Use: ``model.generate(..., custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=d, num_speculative_tokens="auto")``
    or pass an ``AdaptiveK(...)`` instance as ``num_speculative_tokens`` to change its settings (each call runs
    its own copy of it, reset at the start, so one instance can configure concurrent calls).
    """

    def __init__(self, k_min: int = 1, k_max: int = 8, k_start: int | None = None, decay: float = 0.97,
                 window: int = 9, margin: float = 0.03, off_below: float = 1.0, off_steps: int = 8,
                 max_off_steps: int = 128, dwell_steps: int = 4, plain_steps: int = 3, refresh_steps: int = 64):
        if not (isinstance(k_min, int) and isinstance(k_max, int) and 1 <= k_min <= k_max):
            raise ValueError(f"need integers 1 <= k_min <= k_max, got k_min={k_min!r}, k_max={k_max!r}")
        if k_start is not None and not (isinstance(k_start, int) and k_start >= 1):
            raise ValueError(f"k_start must be an integer >= 1, got {k_start!r}")
        if not (0 < decay < 1 and 0 <= margin < 1 and 0 <= off_below < float("inf")):  # NaN fails too
            raise ValueError(f"need 0 < decay < 1, 0 <= margin < 1, a finite off_below >= 0; got decay={decay!r}, "
                             f"margin={margin!r}, off_below={off_below!r}")
        if (off_steps < 1 or max_off_steps < off_steps or dwell_steps < 1
                or not (isinstance(plain_steps, int) and plain_steps >= 1)
                or not (isinstance(window, int) and window >= plain_steps)
                or not (isinstance(refresh_steps, int) and refresh_steps >= 1)):
            raise ValueError("need off_steps >= 1, max_off_steps >= off_steps, dwell_steps >= 1, "
                             "an integer plain_steps >= 1, an integer window >= plain_steps (T_1 is the median "
                             "of the first plain_steps plain steps) and an integer refresh_steps >= 1; got "
                             f"window={window!r}, plain_steps={plain_steps!r}, refresh_steps={refresh_steps!r}")
        self.k_min, self.k_max, self.k_start = k_min, k_max, k_start
        self.decay, self.window, self.margin, self.off_below = decay, window, margin, off_below
        self.off_steps, self.max_off_steps, self.dwell_steps = off_steps, max_off_steps, dwell_steps
        self.plain_steps, self.refresh_steps = plain_steps, refresh_steps
        self.reset()

    # ---- state ----------------------------------------------------------------------------------
    def reset(self, drafter_k: int | None = None, drafter_k_max: int | None = None) -> None:
        """Forget everything (called by the loop at the start of each generate call).

        Args:
            drafter_k: the drafter's own k, the first larger k measured (default 3).
            drafter_k_max: the most the drafter can propose (``None``: no limit).
        """
        self.hi = min(self.k_max, drafter_k_max) if drafter_k_max else self.k_max
        self.lo = min(self.k_min, self.hi)
        self.start = max(self.lo, min(self.hi, self.k_start or self.lo))
        self.explore = max(self.lo, min(self.hi, drafter_k or 3))
        self.reached: list[float] = []
        self.accepted: list[float] = []
        self._plain: list[float] = []
        self._verify: dict[int, list[float]] = {}
        self._draft: dict[int, list[float]] = {}  # drafting seconds per step, by k
        self._step: dict[int, list[tuple[float, bool]]] = {}  # (drafting + verifying seconds, drafted?) by k
        self.k = 0  # the k of the coming step; 0 = plain decoding
        self.mode = "start"  # start -> measure -> on <-> off -> probe -> on | off ("refresh": one plain step in on)
        self.steps_in_mode = 0
        self.off_length = self.off_steps
        self.probe_k = self.lo
        self.paid_k: int | None = None  # the k in use when a judgment last found speculation paying
        self.pending: dict | None = None
        self.since_plain = 0  # decode steps since the last plain one

    def _add(self, values: list[float], new: float) -> None:
        values.append(new)
        del values[:-self.window]

    @staticmethod
    def _median(values: list[float]) -> float | None:
        return statistics.median(values) if values else None

    def keep_drafter_k(self) -> None:
        """Speculate at the drafter's own k only (the ``drafter_k`` of :meth:`reset`, within ``k_max``): the
        controller then decides only whether speculation pays (on, off, probes, the catch-up check), never
        another k. The loop calls it after :meth:`reset` for a drafter that ends a row's draft where it doubts
        its next token (:attr:`~hf_spec.drafters.base.Drafter.stops_when_unsure`, a draft model's confidence
        stop): k is a cap there that the drafter shortens itself, step by step and row by row. The cost model
        cannot price a smaller cap: a step at the cap drafts fewer tokens than it asks for, so drafting's cost
        per asked token, extrapolated to a smaller cap, made that cap look cheap (measured on the 13 x 2 bench:
        `-k auto` moved from 6 to 2 or 3 after 4 steps on most prompts), where fixed k = 6 with the stop had
        beaten auto by 3-8% on the median of prompts."""
        self.start = self.lo = self.hi = self.explore

    def start_from(self, plain_times: list[float]) -> None:
        """Start the T_1 estimate from plain-step times (seconds) measured earlier with the same target, batch
        size and prompt-length bucket (:func:`remembered_plain_times`; the loop calls it after :meth:`reset`):
        the latest ``window`` of them are kept, and with ``plain_steps`` of them no decode step is made plain
        just to measure T_1."""
        self._plain = [float(t) for t in plain_times][-self.window:]

    @property
    def plain_times(self) -> list[float]:
        """The latest plain-step times in seconds (at most ``window``, oldest first), earlier calls' included."""
        return list(self._plain)

    @property
    def t_plain(self) -> float | None:
        """Estimated T_1 in seconds (``None`` before the first plain step): the median of the latest plain
        steps."""
        t = self._median(self._plain)
        return None if t is None else max(1e-9, t)

    @property
    def t_verify(self) -> dict[int, float]:
        """Estimated verify forward time in seconds, by positions per row n (> 1) seen so far."""
        return {n: self._median(v) for n, v in self._verify.items()}

    def draft_line(self) -> tuple[float, float]:
        """``(c_0, c_1)``: drafting seconds per step ~ ``c_0 + c_1 k``, least squares through the median
        drafting time of each k seen (with one k seen: ``c_0 = 0``; ``(0, 0)`` before any)."""
        pts = [(k, self._median(v)) for k, v in self._draft.items() if v]
        if not pts:
            return 0.0, 0.0
        if len(pts) == 1:
            return 0.0, pts[0][1] / pts[0][0]
        mk, md = sum(k for k, _ in pts) / len(pts), sum(d for _, d in pts) / len(pts)
        c1 = sum((k - mk) * (d - md) for k, d in pts) / sum((k - mk) ** 2 for k, _ in pts)
        c1 = max(0.0, c1)
        return max(0.0, md - c1 * mk), c1

    def __call__(self, event: StepEvent) -> None:
        """Update the estimates from one step (the loop calls it as an event listener)."""
        if event.step == 0:
            return
        rows = [(d, a, e) for d, a, e in zip(event.drafted, event.num_accepted, event.emitted) if e]
        if not rows:
            return
        n = event.positions or 1 + max(len(d) for d, _, _ in rows)  # positions per row in the verify forward
        self.since_plain = 0 if n == 1 else self.since_plain + 1
        if n == 1:
            self._add(self._plain, event.verify_time_s)
        else:
            self._add(self._verify.setdefault(n, []), event.verify_time_s)
        k = event.num_speculative_tokens
        if k > 0:
            self._add(self._draft.setdefault(k, []), event.draft_time_s)
            # (seconds, whether it drafted): a drafter that found nothing (an n-gram miss) makes a plain step
            self._add(self._step.setdefault(k, []), (event.draft_time_s + event.verify_time_s, n > 1))
            # only the positions this step could observe forget: the others keep what was last seen there
            self.reached[:k] = [r * self.decay for r in self.reached[:k]]
            self.accepted[:k] = [a * self.decay for a in self.accepted[:k]]
            for _, accepted, _ in rows:  # an empty draft position counts as a rejection (see SpecStats)
                count_positions(self.reached, self.accepted, k, accepted)
        self.steps_in_mode += 1

    # ---- the model ------------------------------------------------------------------------------
    def acceptance(self) -> list[float]:
        """Estimated conditional acceptance by position: each position's (decayed) counts plus one
        pseudo-observation at the estimate of the position before (0.5 for the first); positions without
        data take the last estimate. Shrinking every position towards 0.5 instead made positions seen a few
        times look worse than they are where the drafter is nearly always right (a math answer: 0.70 / 0.88
        for positions 2-3 after 4 steps, truly ~0.9), and larger k were never tried again."""
        rates, prior = [], 0.5
        for a, r in zip(self.accepted, self.reached):
            if r < 0.5:
                break
            prior = (a + prior) / (r + 1.0)
            rates.append(prior)
        return rates or [0.5]

    def verify_cost(self, n: int) -> float:
        """Estimated T_verify(n) / T_1: :func:`forward_time` over the plain-step time and the verify times
        measured so far.

        Anchored at a measured point, not at 1: in native bfloat16 on a CPU a 2-position forward can cost
        less than a plain step (0.9 T_1 measured; transformers' one-query attention path), and a line
        forced through 1 priced 4 positions above the 2 it had measured, so a drafter at k = 1 never
        looked able to gain at k = 3."""
        if n == 1:
            return 1.0
        t_plain = self.t_plain
        return forward_time({1: t_plain, **self.t_verify}, n) / t_plain

    def model(self) -> _Model:
        """The current estimates (acceptance, drafting line, share of steps that drafted, a miss's cost), for
        :meth:`step_cost` and :meth:`predicted_speedup` of every k (needs T_1 measured)."""
        steps = [step for v in self._step.values() for step in v]
        p = sum(d for _, d in steps) / len(steps) if steps else 1.0
        t_miss = (self._median([t for t, d in steps if not d]) or self.t_plain) / self.t_plain
        return _Model(self.acceptance(), self.draft_line(), p, t_miss)

    def step_cost(self, k: int, model: _Model | None = None) -> float:
        """Seconds of one step at k over T_1, ``p t_draft(k) + (1 - p) t_miss``: a drafter may find nothing to
        propose (an n-gram miss), and such a step verifies one position. ``p`` is the fraction of recent
        speculative steps that drafted (pooled over every k: whether a match exists does not depend on k),
        ``t_miss`` the median of those that did not, ``t_draft(k)`` the median of the steps at k that drafted
        where there are any, else ``T_verify(k+1) + c_0 + c_1 k`` (``model``: :meth:`model`, when already
        computed). Weighting the two medians by how often each happens matters: one median over both would
        report the cheap mode while the expensive one costs."""
        if k == 0:
            return 1.0
        model = model or self.model()
        drafted = [t for t, d in self._step.get(k, []) if d]
        if drafted:
            t_draft = self._median(drafted) / self.t_plain
        else:
            c0, c1 = model.draft_line
            t_draft = self.verify_cost(k + 1) + (c0 + c1 * k) / self.t_plain
        return model.p * t_draft + (1 - model.p) * model.t_miss

    def predicted_speedup(self, k: int, model: _Model | None = None) -> float:
        """Predicted speedup over plain decoding at k (needs T_1 measured)."""
        model = model or self.model()
        return expected_tokens_per_step(model.acceptance, k) / max(1e-9, self.step_cost(k, model))

    # ---- the decision ---------------------------------------------------------------------------
    def _record(self, k: int, mode: str, reason: str, predicted: float | None = None) -> None:
        self.pending = {"k": k, "mode": mode, "reason": reason}
        if predicted is not None:
            self.pending["predicted_speedup"] = round(predicted, 4)
        logger.debug("hf_spec adaptive k: %s", self.pending)

    def _set(self, k: int, mode: str, reason: str, predicted: float | None = None) -> None:
        self.k, self.mode, self.steps_in_mode = k, mode, 0
        self._record(k, mode, reason, predicted)

    def catch_up_pays(self, k: int, catch_up_s: float, remaining_tokens: int) -> bool:
        """Whether speculating at k can repay a drafter's one-off catch-up before ``max_length``; the loop asks
        after :meth:`decide` picked k > 0 and the drafter reported one
        (:meth:`~hf_spec.drafters.base.Drafter.catch_up_cost`: a draft model's prefill of a long prompt at its
        first draft, or of the tokens of an off period). It pays when the time k is predicted to save over the
        tokens left, ``(1 - 1 / S(k)) x remaining_tokens x T_1``, exceeds it. Before any speculative step the
        prediction S(k) rests on the prior acceptance and a free drafter, so it is optimistic: speculation
        then never starts where even that cannot repay the catch-up (a 700-token prompt, 16 new tokens), and
        the usual judgment takes over where it can. When it does not pay, speculation is switched off as by
        :meth:`decide` (an ``"off"`` record, a probe after ``off_length`` plain steps, asked here again with
        fewer tokens left).

        Args:
            k: the k :meth:`decide` picked (> 0).
            catch_up_s: the catch-up's estimated seconds.
            remaining_tokens: the most tokens a row can still get before ``max_length``.
        """
        if self.t_plain is None or catch_up_s <= self.t_plain:
            # a catch-up shorter than one plain step (the few tokens of an off period before a probe) is left to
            # the usual judgment: a probe is predicted to lose (that is why speculation is off), so weighing its
            # small catch-up against that prediction would never let it probe again
            return True
        speed = self.predicted_speedup(k)
        saving = (1.0 - 1.0 / speed) * remaining_tokens * self.t_plain if speed > 0 else 0.0
        if catch_up_s <= saving:
            return True
        self.probe_k = k
        self._set(0, "off", f"drafter catch-up ~{catch_up_s:.2f} s > ~{max(0.0, saving):.2f} s that k={k} could save "
                            f"over {remaining_tokens} tokens (predicted {speed:.2f}x)", speed)
        return False

    def decide(self) -> tuple[int, dict | None]:
        """The k for the coming step (0 = plain decoding), and the decision record when it changed."""
        self.pending = None
        if self.mode in ("start", "measure") and len(self._plain) < self.plain_steps:
            if self.mode == "start":  # the first decode steps are plain: they measure T_1
                self._set(0, "measure", f"first {self.plain_steps} decode steps plain, to measure T_1")
            return self.k, self.pending
        if self.mode in ("start", "measure"):
            # "start" here: T_1 came with the call (start_from), from earlier calls' plain steps
            self._set(self.start, "on", f"start at k={self.start}" + (
                f" (T_1 from {len(self._plain)} plain steps of earlier calls)" if self.mode == "start" else ""))
            return self.k, self.pending
        if self.mode in ("on", "probe") and self.steps_in_mode < self.dwell_steps:
            return self.k, self.pending  # measure a new k (or a probe) for a few steps before judging it
        if self.mode == "on" and self.since_plain >= self.refresh_steps:  # the k in use stays self.k
            self._record(0, "refresh", f"one plain step to measure T_1 again (none in {self.since_plain} steps), "
                                       f"then k={self.k} again")
            return 0, self.pending
        if self.mode == "off":
            if self.steps_in_mode >= self.off_length:
                # old acceptance counts came from the text before the switch-off: let fresh ones dominate
                self.reached = [r * 0.25 for r in self.reached]
                self.accepted = [a * 0.25 for a in self.accepted]
                self._set(self.probe_k, "probe", f"probe at k={self.probe_k} after {self.off_length} plain steps")
            return self.k, self.pending
        model = self.model()  # once per step, shared by every k
        best, speed = max(((k, self.predicted_speedup(k, model)) for k in range(self.lo, self.hi + 1)),
                          key=lambda t: (t[1], -t[0]))
        larger = self._next_to_measure()
        if larger is not None:
            reason = self._worth_measuring(larger, speed, model)
            if reason:  # a probe that measures a larger k stays a probe: judged (and doubled) as one
                self._set(larger, "probe" if self.mode == "probe" else "on", reason, speed)
                return self.k, self.pending
        if speed < self.off_below * (1 - self.margin) or (self.mode == "probe" and speed < self.off_below):
            if self.mode == "probe":
                self.off_length = min(self.max_off_steps, 2 * self.off_length)
            # the next probe runs the k that paid last (a probe asks whether the text is back to what it was
            # then; at a smaller k it would judge the drafter by its worst k again), else the k that came closest
            self.probe_k = self.paid_k or best
            self._set(0, "off", f"best k={best} predicted {speed:.2f}x < {self.off_below:.2f}x "
                                f"(a_1={model.acceptance[0]:.2f}, step cost={self.step_cost(best, model):.2f} T_1)",
                      speed)
            return self.k, self.pending
        if self.mode == "probe":
            self.off_length = self.off_steps
            self._set(best, "on", f"probe predicted {speed:.2f}x at k={best}", speed)
        else:
            current = self.predicted_speedup(self.k, model)
            if best != self.k and speed > current * (1 + self.margin):
                self._set(best, "on", f"k {self.k}->{best}: predicted {speed:.2f}x vs {current:.2f}x", speed)
        if self.predicted_speedup(self.k, model) >= self.off_below:
            self.paid_k = self.k
        return self.k, self.pending

    def _next_to_measure(self) -> int | None:
        """The larger k to measure next, or ``None``: the drafter's own k until it is measured, then twice the
        largest k measured (capped at ``k_max``), once each."""
        if not self._step:
            return None
        largest = max(self._step)
        nxt = self.explore if largest < self.explore else min(self.hi, 2 * largest)
        return nxt if nxt > largest and nxt not in self._step else None

    def _worth_measuring(self, k: int, speed: float, model: _Model) -> str | None:
        """Why a larger, unmeasured ``k`` should be measured for a dwell before the next judgment, or ``None``.

        Two optimistic models of a step at ``k``; either predicting a gain (over the best predicted speedup and
        over ``off_below``, by ``margin``) is enough:

        - while one k alone has been measured: drafting costs per step what it costs now at the k in use,
          whatever k (verifying as modelled), and the positions not observed yet accept halfway between the
          last position observed and 0.5 (no less than that position). A draft model with a large per-step
          cost can lose at one k and win at a larger one, and a drafter that copies from its context is right
          more often once its first token was (suffix drafts on a retrieval prompt: a_1 = 0.16, then 0.50
          and 0.38 measured at k = 3; the judgment's own model, which starts unseen positions from the one
          before, kept k = 1 for the whole answer). Once two k are measured, drafting's per-token cost is
          measured too, and the fitted line decides (an int8 draft model at 0.2 T_1 per token looked free per
          step under this model, and 4 steps each at k = 6 and k = 8 on prose that accepted 39% cost more than
          they found);
        - only where no k is predicted to pay by ``margin`` (the judgment is about to switch speculation off or
          keep a k that barely pays): a step at ``k`` costs what a step at the largest k measured costs (an
          upper bound: a larger k never costs less). This is high acceptance at the positions seen: the
          tokens a step emits could pay for a per-step overhead (a draft forward, a verify forward that
          costs far more than a plain step whatever its positions) that a linear model extrapolated from
          the smallest k charges once per drafted token. Measured: on an AVX-512 Xeon in float32, a step
          at k = 1 cost 2.23 T_1 and lost (0.85x predicted at a = 0.9), while fixed k = 3 won (1.06x);
          the linear model never let k = 3 be measured. Where k already pays by ``margin`` this model is not
          used: measuring k = 3 for a dwell where k = 1 paid 1.14x (n-gram on a short translation, first
          token accepted half the time, the next 10%) cost 9% of an 18-token answer.
        """
        largest = max(self._step)
        step_draft = self._median(self._draft.get(self.k, [])) or 0.0
        gain = max(speed, self.off_below) * (1 + self.margin)
        seen = model.acceptance[:largest]
        unseen = [max(seen[-1], (seen[-1] + 0.5) / 2)] * (k - len(seen))
        hopeful = self.predicted_speedup(k, model._replace(acceptance=seen + unseen, draft_line=(step_draft, 0.0)))
        if hopeful > gain and len(self._step) < 2:
            return f"predicted {speed:.2f}x (k={k}: up to {hopeful:.2f}x): measure k={k} too"
        bound = expected_tokens_per_step(model.acceptance, k) / max(1e-9, self.step_cost(largest, model))
        if speed < self.off_below * (1 + self.margin) and bound > gain:
            return (f"predicted {speed:.2f}x, but a_1..{largest}={_rates(model.acceptance[:largest])} could pay at "
                    f"k={k} (up to {bound:.2f}x at the step cost of k={largest}): measure k={k} too")
        return None


def _rates(rates: list[float]) -> str:
    return "/".join(f"{a:.2f}" for a in rates)


class CycleK(AdaptiveK):
    """A fixed schedule for calibration: each k in ``k_min..k_max`` for ``repeat`` steps in a row, then the
    next, round and round; each decode step's time is recorded by k (what ``hf-spec tune`` uses to measure,
    inside the loop itself, the draft cost and verify cost of every k in one run).

    Only steps that follow a step of the same k are recorded: a draft model catches up at each step on the
    tokens it has not seen (the last step's accepted ones), so a step right after a longer or shorter k, or
    the first speculative step of a call (where a draft model also prefills the prompt), would not cost
    what a step at a fixed k costs.

    Args:
        k_min: the smallest k.
        k_max: the largest k.
        repeat: steps per k before the next (>= 2, so that every k has recorded steps).

    Attributes:
        calls: one dict per generate call (the loop calls :meth:`reset` at the start of each), mapping the
            number of drafted positions d to a list of ``(draft_time_s, verify_time_s)`` of recorded steps.

    Use: ``model.generate(..., custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=d, num_speculative_tokens=CycleK(1, 6))``.
    """

    def __init__(self, k_min: int = 1, k_max: int = 8, repeat: int = 2):
        if not (isinstance(repeat, int) and repeat >= 2):
            raise ValueError(f"repeat must be an integer >= 2, got {repeat!r}")
        self.repeat = repeat
        self.calls: list[dict[int, list[tuple[float, float]]]] = []
        super().__init__(k_min=k_min, k_max=k_max)
        self.calls.clear()  # __init__'s own reset is not a call

    def keep_drafter_k(self) -> None:
        """Nothing: a calibration schedule measures every k, a drafter that stops when unsure included (``hf-spec
        tune`` with a draft model would otherwise calibrate its cap alone)."""

    def reset(self, drafter_k: int | None = None, drafter_k_max: int | None = None) -> None:
        super().reset(drafter_k, drafter_k_max)
        self.calls.append({})
        self._next, self._previous_k = 0, None

    def __call__(self, event: StepEvent) -> None:
        if event.step == 0:
            return
        k, previous = event.num_speculative_tokens, self._previous_k
        self._previous_k = k
        if k != previous:
            return
        drafted = max((len(d) for d, e in zip(event.drafted, event.emitted) if e), default=0)
        self.calls[-1].setdefault(drafted, []).append((event.draft_time_s, event.verify_time_s))

    def catch_up_pays(self, k: int, catch_up_s: float, remaining_tokens: int) -> bool:
        return True  # a calibration runs its schedule (the first speculative step is not recorded anyway)

    def decide(self) -> tuple[int, dict | None]:
        k = self.lo + (self._next // self.repeat) % (self.hi - self.lo + 1)
        self._next += 1
        return k, None


class TreeSize:
    """Online choice of a draft tree's size, ``num_tree_nodes="auto"``: the size with the most tokens per second
    measured in this call.

    Whether a tree pays depends on what no model here predicts well: how much the draft's second and third
    guesses add to its first on this text, and what a verify over N + 1 positions costs on this device and dtype
    (on a CPU without native bfloat16 it grows with N at once; with AVX512-BF16 it stays near a plain step up to
    ~7 positions; with AMX, or on a GPU, up to tens of positions). So the sizes in ``sizes`` are measured: the
    loop asks :meth:`decide` before every speculative step (k > 0, from the call or from :class:`AdaptiveK`,
    which still decides whether to speculate at all), and this listener counts the tokens each step emitted
    against its drafting and verifying seconds. The ``start`` size first, then the smaller sizes in order, then
    the larger ones as a ladder: the next larger size is measured only while the largest measured so far has
    the highest rate, so a machine where a small tree does not pay never spends steps on a large one. Each
    measurement is ``dwell_steps`` steps; then the size with the highest rate (tokens summed over its last
    ``window`` steps / their seconds summed) runs, and every ``revisit_steps`` steps each neighbour of the best
    (the sizes on either side) is measured again for a dwell, as the text changes what a tree is worth. 0 is the
    chain.

    Args:
        sizes: tree sizes to choose from (node counts; 0 = a chain), at least one. The default, the chain and
            trees of 6, 12 and 24 nodes: on a 2-core CPU with AVX512-BF16 a verify of up to ~7 positions cost
            about one plain step and one of 9-17 cost 1.3-1.6, and there draft-model trees of 6 and 8 nodes ran at
            1.00-1.06 of the chain and one of 16 at 0.87-0.99; on one with AMX a verify of 24 positions cost 1.08
            plain steps and one of 32 positions 1.14 (docs/benchmarks.md, issues 21 and 22). Every size measured
            costs a few steps of a short answer; the ladder measures 12 only where 6 beat the chain, and 24 only
            where 12 beat 6.
        start: the size measured first (default: the second smallest, a small tree).
        dwell_steps: speculative steps each size is kept while measured (>= 1).
        window: steps per size in its rate (>= dwell_steps).
        revisit_steps: speculative steps between re-measurements of the best size's neighbours (>= 1).
        margin: another size is taken when its rate beats the current one's by this fraction (``0 <= margin < 1``).

    Raises:
        ValueError: a setting out of range.

    Attributes:
        rates: ``{size: tokens per second}`` measured so far in this call.
        choices: ``(step, size, reason)`` of every change of size, in order.
    """

    def __init__(self, sizes=(0, 6, 12, 24), start: int | None = None, dwell_steps: int = 3, window: int = 8,
                 revisit_steps: int = 32, margin: float = 0.05):
        sizes = sorted({int(n) for n in sizes}) if all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in sizes) else None
        if not sizes:
            raise ValueError("TreeSize needs sizes: integers >= 0 (0 = a chain), e.g. (0, 8, 16)")
        if start is None:
            start = sizes[1] if len(sizes) > 1 else sizes[0]
        if start not in sizes:
            raise ValueError(f"start={start!r} is not one of sizes={sizes}")
        if not (isinstance(dwell_steps, int) and dwell_steps >= 1 and isinstance(window, int) and window >= dwell_steps
                and isinstance(revisit_steps, int) and revisit_steps >= 1):
            raise ValueError(f"need integers dwell_steps >= 1, window >= dwell_steps, revisit_steps >= 1; got "
                             f"{dwell_steps!r}, {window!r}, {revisit_steps!r}")
        if not 0 <= margin < 1:
            raise ValueError(f"need 0 <= margin < 1, got {margin!r}")
        self.sizes, self.start, self.margin = sizes, start, margin
        self.dwell_steps, self.window, self.revisit_steps = dwell_steps, window, revisit_steps
        self.reset()

    def reset(self) -> None:
        """Forget everything (the loop calls it at the start of each generate call, on its own copy)."""
        # sizes to measure, in order: the start, then the smaller ones; the larger ones climb the ladder in decide()
        self._queue = [self.start] + [n for n in self.sizes if n < self.start]
        self._steps: dict[int, list[tuple[int, float]]] = {}  # size -> (tokens, seconds) of its latest steps
        self._measuring = True  # measuring sizes in turn (else: running the best, counting towards a revisit)
        self.size = self._queue.pop(0)
        self._in_size = 0  # steps at the current size
        self._since_revisit = 0
        self.choices: list[tuple[int, int, str]] = []

    @property
    def rates(self) -> dict[int, float]:
        return {n: sum(t for t, _ in v) / max(1e-9, sum(s for _, s in v)) for n, v in self._steps.items() if v}

    def decide(self, step: int = 0) -> int:
        """The tree size for the coming speculative step (0: a chain); ``step`` names the step in :attr:`choices`."""
        if not self.choices:
            self._change(self.size, step, "measure")
        if self._in_size < self.dwell_steps:
            return self.size
        if self._queue:  # still measuring
            self._change(self._queue.pop(0), step, "measure")
            return self.size
        rates = self.rates
        best = max(rates, key=lambda n: (rates[n], -n))
        if self._measuring and best == max(self._steps) and best < self.sizes[-1]:  # the ladder: climb one size
            self._change(self.sizes[self.sizes.index(best) + 1], step, f"measure: {best} beat the smaller sizes")
            return self.size
        self._measuring = False
        if self._since_revisit >= self.revisit_steps:  # measure the best's neighbours again, afresh
            self._since_revisit = 0
            i = self.sizes.index(best)
            self._queue = [self.sizes[j] for j in (i - 1, i + 1) if 0 <= j < len(self.sizes)]
            for n in self._queue:
                self._steps[n] = []
            self._measuring = True
            self._change(self._queue.pop(0), step, f"re-measure next to {best}")
            return self.size
        if best != self.size and rates[best] > rates.get(self.size, 0.0) * (1 + self.margin):
            self._change(best, step, "best: " + ", ".join(f"{n}: {r:.2f} tok/s" for n, r in sorted(rates.items())))
        return self.size

    def _change(self, size: int, step: int, reason: str) -> None:
        self.size, self._in_size = size, 0
        self.choices.append((step, size, reason))
        logger.debug("hf_spec tree size: %s (%s)", size, reason)

    def __call__(self, event: StepEvent) -> None:
        """Count a speculative step's tokens and seconds under the size in use (the loop calls it as a listener)."""
        if event.step == 0 or event.num_speculative_tokens == 0:
            return
        tokens = sum(len(e) for e in event.emitted)
        steps = self._steps.setdefault(self.size, [])
        steps.append((tokens, event.draft_time_s + event.verify_time_s))
        del steps[:-self.window]
        self._in_size += 1
        self._since_revisit += not self._measuring


def make_controller(num_speculative_tokens) -> AdaptiveK | None:
    """``"auto"`` -> a default :class:`AdaptiveK`; an ``AdaptiveK`` -> itself; anything else -> ``None``."""
    if isinstance(num_speculative_tokens, AdaptiveK):
        return num_speculative_tokens
    if isinstance(num_speculative_tokens, str) and num_speculative_tokens == "auto":
        return AdaptiveK()
    return None


# the latest plain-step times of each target (weakly held: a model freed is forgotten), by batch size and
# prompt length (in powers of two)
_PLAIN_TIMES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_PLAIN_TIMES_LOCK = threading.Lock()


def _shape_key(rows: int, prompt_length: int) -> tuple[int, int]:
    # prompt lengths 2^(j-1) < n <= 2^j share a key: T_1 grows with the context (docs/benchmarks.md: a step
    # after a 700-token prompt judged with a T_1 measured after 60-token ones looked 1.5 times dearer)
    return rows, max(0, prompt_length - 1).bit_length()


def remembered_plain_times(model, rows: int, prompt_length: int) -> list[float]:
    """The plain decode-step times (seconds, oldest first) that the last call with a controller measured in
    this process on ``model`` with ``rows`` sequences in its batch and a prompt of about ``prompt_length``
    tokens (the same power-of-two bucket: ``2^(j-1) < prompt_length <= 2^j``); ``[]`` before any."""
    with _PLAIN_TIMES_LOCK:
        return list(_PLAIN_TIMES.get(model, {}).get(_shape_key(rows, prompt_length), []))


def remember_plain_times(model, rows: int, prompt_length: int, times: list[float]) -> None:
    """Keep ``times`` (a controller's plain-step times, :attr:`AdaptiveK.plain_times`) as ``model``'s for
    ``rows`` rows and prompts of about ``prompt_length`` tokens, for the next such call's
    :meth:`AdaptiveK.start_from`; an empty list changes nothing."""
    if not times:
        return
    with _PLAIN_TIMES_LOCK:
        _PLAIN_TIMES.setdefault(model, {})[_shape_key(rows, prompt_length)] = list(times)
