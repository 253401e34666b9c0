"""Adaptive k and the on/off policy: ``num_speculative_tokens="auto"``.

:class:`AdaptiveK` listens to the loop's :class:`~hf_spec.events.StepEvent` s and keeps running estimates of

- the conditional acceptance a_i of each draft position (exponentially decayed counts, so it follows a
  change of text or temperature);
- T_1, the time of a plain decode step (a target forward over one position per row), measured on plain
  steps: the first decode step is one, so are steps with speculation off and n-gram steps that found no
  match;
- T_verify(n), the time of a verify forward over n positions per row (acceptance included), for each n seen,
  and a line ``T_verify(n)/T_1 = 1 + s (n - 1)`` fitted through them for the n not seen yet;
- c, drafting seconds per drafted position over T_1.

Times are medians of the last ``window`` measurements, so one-off costs (a draft model's prefill of the
prompt at its first draft, a cache reallocation) do not sway them.

Before each step it picks the k in ``k_min..k_max`` with the highest predicted speedup
``E[tokens per step] / (T_verify(k+1)/T_1 + k c)`` (:func:`~hf_spec.tuning.expected_speedup`, the model of
Leviathan et al. 2023 with a measured verify cost), moving only when the gain beats a margin, so noise does
not make it thrash. When even the best k is predicted slower than plain decoding (low acceptance, a high
temperature flattening the distributions, a batch large enough to make verification compute-bound, a
drafter that costs more than it saves), speculation is switched off and plain decoding continues; after
``off_steps`` steps it probes again for ``dwell_steps`` steps and stays on if the prediction is back above 1,
else switches off for twice as long (up to ``max_off_steps``): hysteresis. Every change is recorded as the
event's ``policy`` (``{"k", "reason", "predicted_speedup"}``), collected in ``SpecStats.policy_events`` and
logged at DEBUG on the ``hf_spec`` logger.

The output does not depend on k: every k goes through the same acceptance rule, so greedy output stays
token-identical to the target's and sampled output keeps the target's distribution.
"""

from __future__ import annotations

import logging
import statistics

from .events import StepEvent
from .tuning import expected_speedup

__all__ = ["AdaptiveK", "make_controller"]

logger = logging.getLogger("hf_spec")


class AdaptiveK:
    """Online choice of num_speculative_tokens, with speculation switched off where it does not pay.

    Args:
        k_min: the smallest k when speculating (``1 <= k_min <= k_max``).
        k_max: the largest k; also capped by the drafter (a Medusa checkpoint's head count).
        k_start: the k of the first speculative step (default: the drafter's own k, clipped to the range).
        decay: per-step weight kept by past acceptance counts (0 < decay < 1; 0.95 ~ the last 20 steps).
        window: T_1, T_verify(n) and the draft time per token are medians of this many latest measurements.
        margin: a new k must be predicted faster than the current one by this fraction to be taken.
        off_below: speculation switches off when the best k's predicted speedup is under this.
        off_steps: plain steps before the first probe; doubled after each failed probe up to
            ``max_off_steps``, reset when a probe succeeds.
        dwell_steps: steps a new k (or a probe, made at k_min) is kept and measured before the next
            decision: the smoothing that stops thrashing, with ``margin`` and the decayed counts.

    Raises:
        ValueError: a bound or setting out of range.

    Use: ``model.generate(..., custom_generate=hf_spec.generate, drafter=d, num_speculative_tokens="auto")``
    or pass an ``AdaptiveK(...)`` instance as ``num_speculative_tokens`` to change its settings.
    """

    def __init__(self, k_min: int = 1, k_max: int = 8, k_start: int | None = None, decay: float = 0.95,
                 window: int = 9, margin: float = 0.03, off_below: float = 1.0, off_steps: int = 8,
                 max_off_steps: int = 128, dwell_steps: int = 4):
        if not (isinstance(k_min, int) and isinstance(k_max, int) and 1 <= k_min <= k_max):
            raise ValueError(f"need integers 1 <= k_min <= k_max, got k_min={k_min!r}, k_max={k_max!r}")
        if k_start is not None and not (isinstance(k_start, int) and k_start >= 1):
            raise ValueError(f"k_start must be an integer >= 1, got {k_start!r}")
        if not 0 < decay < 1 or not (isinstance(window, int) and window >= 1) or margin < 0 or off_below < 0:
            raise ValueError("need 0 < decay < 1, an integer window >= 1, margin >= 0, off_below >= 0")
        if off_steps < 1 or max_off_steps < off_steps or dwell_steps < 1:
            raise ValueError("need off_steps >= 1, max_off_steps >= off_steps, dwell_steps >= 1")
        self.k_min, self.k_max, self.k_start = k_min, k_max, k_start
        self.decay, self.window, self.margin, self.off_below = decay, window, margin, off_below
        self.off_steps, self.max_off_steps, self.dwell_steps = off_steps, max_off_steps, dwell_steps
        self.reset()

    # ---- state ----------------------------------------------------------------------------------
    def reset(self, drafter_k: int | None = None, drafter_k_max: int | None = None) -> None:
        """Forget everything (called by the loop at the start of each generate call).

        Args:
            drafter_k: the drafter's own k, the default start.
            drafter_k_max: the most the drafter can propose (``None``: no limit).
        """
        self.hi = min(self.k_max, drafter_k_max) if drafter_k_max else self.k_max
        self.lo = min(self.k_min, self.hi)
        start = self.k_start or drafter_k or 3
        self.start = max(self.lo, min(self.hi, start))
        self.reached: list[float] = []
        self.accepted: list[float] = []
        self._plain: list[float] = []
        self._verify: dict[int, list[float]] = {}
        self._draft: list[float] = []  # seconds per drafted position
        self.k = 0  # the k of the coming step; 0 = plain decoding
        self.mode = "start"  # start -> on <-> off -> probe -> on | off
        self.steps_in_mode = 0
        self.off_length = self.off_steps
        self.pending: dict | None = None

    def _add(self, values: list[float], new: float) -> None:
        values.append(new)
        del values[:-self.window]

    @staticmethod
    def _median(values: list[float]) -> float | None:
        return statistics.median(values) if values else None

    @property
    def t_plain(self) -> float | None:
        """Estimated T_1 in seconds (``None`` before the first plain step)."""
        return self._median(self._plain)

    @property
    def t_verify(self) -> dict[int, float]:
        """Estimated verify forward time in seconds, by positions per row n (> 1) seen so far."""
        return {n: self._median(v) for n, v in self._verify.items()}

    @property
    def t_draft(self) -> float | None:
        """Estimated drafting seconds per drafted position."""
        return self._median(self._draft)

    def __call__(self, event: StepEvent) -> None:
        """Update the estimates from one step (the loop calls it as an event listener)."""
        if event.step == 0:
            return
        rows = [(d, a, e) for d, a, e in zip(event.drafted, event.num_accepted, event.emitted) if e]
        if not rows:
            return
        n = 1 + max(len(d) for d, _, _ in rows)  # positions per row in the verify forward
        if n == 1:
            self._add(self._plain, event.verify_time_s)
        else:
            self._add(self._verify.setdefault(n, []), event.verify_time_s)
        k = event.num_speculative_tokens
        if k > 0:
            self._add(self._draft, event.draft_time_s / k)
            while len(self.reached) < k:
                self.reached.append(0.0)
                self.accepted.append(0.0)
            self.reached = [r * self.decay for r in self.reached]
            self.accepted = [a * self.decay for a in self.accepted]
            for _, accepted, _ in rows:  # an empty draft position counts as a rejection (see SpecStats)
                for i in range(min(accepted + 1, k)):
                    self.reached[i] += 1
                for i in range(min(accepted, k)):
                    self.accepted[i] += 1
        self.steps_in_mode += 1

    # ---- the model ------------------------------------------------------------------------------
    def acceptance(self) -> list[float]:
        """Estimated conditional acceptance by position (positions without data take the last estimate;
        each estimate is shrunk towards 0.5 by one pseudo-observation)."""
        rates = [(a + 0.5) / (r + 1.0) for a, r in zip(self.accepted, self.reached) if r >= 0.5]
        return rates or [0.5]

    def verify_cost(self, n: int) -> float:
        """Estimated T_verify(n) / T_1: measured where seen, else the line fitted through what was seen."""
        if n == 1:
            return 1.0
        t_plain, t_verify = self.t_plain, self.t_verify
        if n in t_verify:
            return t_verify[n] / t_plain
        pts = [(m - 1, t / t_plain - 1.0) for m, t in t_verify.items()]
        slope = max(0.0, sum(x * y for x, y in pts) / sum(x * x for x, _ in pts)) if pts else 0.0
        return 1.0 + slope * (n - 1)

    def cost_ratio(self) -> float:
        """Estimated c: draft seconds per drafted position over T_1."""
        return (self.t_draft or 0.0) / self.t_plain

    def predicted_speedup(self, k: int) -> float:
        """Predicted speedup over plain decoding at k (needs T_1 measured)."""
        return expected_speedup(self.acceptance(), k, self.cost_ratio(), self.verify_cost)

    # ---- the decision ---------------------------------------------------------------------------
    def _set(self, k: int, mode: str, reason: str, predicted: float | None = None) -> None:
        self.k, self.mode, self.steps_in_mode = k, mode, 0
        self.pending = {"k": k, "mode": mode, "reason": reason}
        if predicted is not None:
            self.pending["predicted_speedup"] = round(predicted, 4)
        logger.debug("hf_spec adaptive k: %s", self.pending)

    def decide(self) -> tuple[int, dict | None]:
        """The k for the coming step (0 = plain decoding), and the decision record when it changed."""
        self.pending = None
        if self.t_plain is None:  # the first decode step is plain: it measures T_1
            if self.mode == "start":
                self._set(0, "measure", "first decode step plain, to measure T_1")
            return self.k, self.pending
        if self.mode in ("start", "measure"):
            self._set(self.start, "on", f"start at k={self.start}")
            return self.k, self.pending
        if self.mode in ("on", "probe") and self.steps_in_mode < self.dwell_steps:
            return self.k, self.pending  # measure a new k (or a probe) for a few steps before judging it
        best, speed = max(((k, self.predicted_speedup(k)) for k in range(self.lo, self.hi + 1)),
                          key=lambda t: (t[1], -t[0]))
        if self.mode == "off":
            if self.steps_in_mode >= self.off_length:
                # old acceptance counts came from the text before the switch-off: let fresh ones dominate
                self.reached = [r * 0.25 for r in self.reached]
                self.accepted = [a * 0.25 for a in self.accepted]
                self._set(self.lo, "probe", f"probe after {self.off_length} plain steps")
            return self.k, self.pending
        if speed < self.off_below:
            if self.mode == "probe":
                self.off_length = min(self.max_off_steps, 2 * self.off_length)
            self._set(0, "off", f"best k={best} predicted {speed:.2f}x < {self.off_below:.2f}x "
                                f"(a_1={self.acceptance()[0]:.2f}, c={self.cost_ratio():.2f}, "
                                f"verify={self.verify_cost(best + 1):.2f})", speed)
            return self.k, self.pending
        if self.mode == "probe":
            self.off_length = self.off_steps
            self._set(best, "on", f"probe predicted {speed:.2f}x at k={best}", speed)
            return self.k, self.pending
        current = self.predicted_speedup(self.k)
        if best != self.k and speed > current * (1 + self.margin):
            self._set(best, "on", f"k {self.k}->{best}: predicted {speed:.2f}x vs {current:.2f}x", speed)
        return self.k, self.pending


def make_controller(num_speculative_tokens) -> AdaptiveK | None:
    """``"auto"`` -> a default :class:`AdaptiveK`; an ``AdaptiveK`` -> itself; anything else -> ``None``."""
    if isinstance(num_speculative_tokens, AdaptiveK):
        return num_speculative_tokens
    if isinstance(num_speculative_tokens, str) and num_speculative_tokens == "auto":
        return AdaptiveK()
    return None
