"""Statistics of speculative generation, built from the loop's :class:`~hf_spec.events.StepEvent` s.

Terms (as in vLLM's spec-decode metrics):

- drafted tokens: tokens a drafter proposed and the target verified;
- accepted tokens: drafted tokens that were kept and emitted;
- emitted tokens: all new tokens; each target forward emits its accepted drafted tokens plus one token of
  its own (the correction or the bonus token), so ``emitted = accepted + target forwards`` (the prefill
  forward emits the first token; with a batch, one count per row and forward). When EOS or ``max_new_tokens`` ends a row inside an accepted run, the
  last kept token is counted as the target's token of that forward (the target chose it too);
- acceptance rate: ``accepted / drafted``;
- mean accepted length: emitted tokens per target forward (per row), the bonus/correction token
  included, prefill excluded;
- acceptance by position: for each draft position i, the fraction of drafts with at least i+1 tokens
  whose token i was accepted;
- TTFT: time from the start of the call to the first new token (the prefill); TPOT: time per output
  token after the first, ``(total - TTFT) / (new tokens - 1)``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .events import StepEvent

__all__ = ["SpecStats", "count_positions"]


def _tree_depth(parents: list[int]) -> int:
    """How deep a draft tree reaches (its nodes' parents, ``-1``: the root; earlier nodes)."""
    depth: list[int] = []
    for p in parents:
        depth.append(1 if p < 0 else depth[p] + 1)
    return max(depth, default=0)


def count_positions(reached: list, accepted: list, k: int, num_accepted: int, weight: float = 1,
                    drafted: list | None = None, num_drafted: int = 0) -> None:
    """Count one row-step of a draft of up to k tokens into per-position lists (the one counting rule of the
    statistics, the benchmark and the adaptive controller; the lists grow as needed).

    Position i was *reached* when the first i drafted tokens were accepted (for ``i < min(num_accepted + 1, k)``:
    a position the drafter left empty counts as reached and rejected, so a drafter that finds nothing to
    propose lowers the acceptance it is judged by), *accepted* for ``i < min(num_accepted, k)``, and
    *drafted* for ``i < num_drafted``.

    Args:
        reached: per-position counts of reached positions, updated in place (ints, or decayed floats).
        accepted: per-position counts of accepted tokens, the same way.
        k: the k asked for this step.
        num_accepted: drafted tokens accepted in this row-step.
        weight: what one observation adds (1: integer counts stay integers).
        drafted: optional per-position counts of drafted tokens, updated the same way.
        num_drafted: the draft's length (with ``drafted``).
    """
    n = max(k, num_drafted)
    for counts in (reached, accepted) + ((drafted,) if drafted is not None else ()):
        counts.extend([0] * (n - len(counts)))
    for i in range(min(num_accepted + 1, k)):
        reached[i] += weight
    for i in range(min(num_accepted, k)):
        accepted[i] += weight
    if drafted is not None:
        for i in range(num_drafted):
            drafted[i] += weight


@dataclass
class SpecStats:
    """Counters of one generate call (or, via :meth:`merge`, of many).

    Use it as an event listener: ``stats(event)`` records one :class:`StepEvent`. A listener kept over several
    calls (one at a time) counts them all as :meth:`merge` adds them (times summed, TTFT too: :attr:`mean_ttft_s`
    is the mean per call), but for :attr:`per_row`, which holds the last call's rows.
    """

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_emitted_tokens: int = 0
    num_target_forwards: int = 0
    num_row_steps: int = 0
    num_sequences: int = 0
    #: prompt tokens of the sequences counted (without left padding): vLLM's ``prompt_tokens``
    num_prompt_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    drafted_per_position: list[int] = field(default_factory=list)
    #: per draft position i: row-steps with a draft attempt whose first i drafted tokens were accepted
    reached_per_position: list[int] = field(default_factory=list)
    k_per_step: list[int] = field(default_factory=list)
    #: per step after the prefill: the positions the target verified per row, the drafted chain's or tree's nodes
    #: plus one (``StepEvent.positions``; 1: a plain step): with ``num_tree_nodes="auto"``, the tree sizes it chose
    positions_per_step: list[int] = field(default_factory=list)
    #: seconds to the first token (the prefill step), summed over merged calls; :attr:`mean_ttft_s` per call
    ttft_s: float = 0.0
    total_s: float = 0.0
    #: generate calls counted (1 for one call; merged calls and a listener kept over calls add theirs)
    num_calls: int = 0
    #: seconds each row spent after its first token, summed over rows (rows of a batch run at the same time, each
    #: counts its own), and the tokens they emitted in that time: :attr:`tpot_s` is their ratio
    decode_s: float = 0.0
    decode_tokens: int = 0
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    policy_events: list[dict] = field(default_factory=list)
    #: for drafters with several sources (the hybrid drafter): per source name, ``{"drafts", "draft_tokens",
    #: "accepted_tokens"}`` (row-steps it drafted, tokens it drafted, of them accepted)
    per_source: dict[str, dict[str, int]] = field(default_factory=dict)
    #: with a batch (B > 1): the statistics of each row, by its index in the batch (``time`` fields: until
    #: that row finished); a listener kept over calls: the last call's
    per_row: dict[int, "SpecStats"] = field(default_factory=dict)
    #: the drafter's :attr:`~hf_spec.drafters.base.Drafter.method` (``StepEvent.method``); ``None`` without one;
    #: merged statistics of several drafters list theirs, ``", "``-separated
    method: str | None = None

    def __post_init__(self):
        # a listener kept over calls adds each call's times as merge() does: the seconds of the calls before this
        # one, and this call's clock at its last event
        self._before_s, self._last_s = self.total_s, 0.0

    def __call__(self, event: StepEvent) -> None:
        if event.aborted:  # a failed call's last word: no forward, nothing emitted
            return
        if event.step == 0:  # a call starts (one at a time per listener)
            if self.num_target_forwards:  # a listener kept over calls: per_row is this call's rows
                self.per_row = {}
            self._before_s, self._last_s = self.total_s, 0.0
        if len(event.emitted) > 1 or self.per_row:
            for i, row in enumerate(event.rows if event.rows is not None else range(len(event.emitted))):
                self.per_row.setdefault(row, SpecStats())(
                    StepEvent(event.step, event.num_speculative_tokens, [event.drafted[i]], [event.num_accepted[i]],
                              [event.emitted[i]], event.draft_time_s, event.verify_time_s, event.time_s,
                              [event.finished[i]], event.policy,
                              sources=[event.sources[i]] if event.sources is not None else None,
                              parents=[event.parents[i]] if event.parents is not None else None,
                              positions=event.positions,
                              accepted_path=[event.accepted_path[i]] if event.accepted_path is not None else None,
                              method=event.method,
                              prompt_tokens=[event.prompt_tokens[i]] if event.prompt_tokens is not None else None))
        if event.method is not None and event.method != self.method:  # a listener kept over calls: each one's
            self._add_method(event.method)
        self.num_target_forwards += 1
        self.draft_time_s += event.draft_time_s
        self.verify_time_s += event.verify_time_s
        if event.step > 0:  # every row in the step waited for it (a finished row has left the batch)
            rows = sum(1 for emitted in event.emitted if emitted)
            self.decode_s += (event.time_s - self._last_s) * rows
            self.decode_tokens += sum(len(emitted) for emitted in event.emitted)
        self._last_s = event.time_s
        self.total_s = self._before_s + event.time_s
        if event.step == 0:
            self.ttft_s += event.time_s
            self.num_calls += 1
            self.num_sequences += len(event.emitted)
            self.num_prompt_tokens += sum(event.prompt_tokens or ())
        else:
            self.k_per_step.append(event.num_speculative_tokens)
            self.positions_per_step.append(event.positions)
        if event.policy:
            self.policy_events.append(dict(event.policy, step=event.step))
        for i, (drafted, emitted, accepted) in enumerate(zip(event.drafted, event.emitted, event.num_accepted)):
            if not emitted:
                continue
            if event.sources is not None and drafted:
                counts = self.per_source.setdefault(event.sources[i], dict(drafts=0, draft_tokens=0,
                                                                           accepted_tokens=0))
                counts["drafts"] += 1
                counts["draft_tokens"] += len(drafted)
                counts["accepted_tokens"] += accepted
            self.num_row_steps += 1
            self.num_emitted_tokens += len(emitted)
            k = event.num_speculative_tokens if event.step > 0 else 0
            # a tree's positions are its depths: num_drafted is how deep it reaches
            depth = len(drafted) if event.parents is None else _tree_depth(event.parents[i])
            count_positions(self.reached_per_position, self.accepted_per_position, k, accepted,
                            drafted=self.drafted_per_position, num_drafted=depth)
            if drafted:
                self.num_drafts += 1
                self.num_draft_tokens += len(drafted)
                self.num_accepted_tokens += accepted

    def _grow(self, n: int) -> None:
        while len(self.drafted_per_position) < n:
            self.drafted_per_position.append(0)
            self.accepted_per_position.append(0)
            self.reached_per_position.append(0)

    # ---- derived values -------------------------------------------------------------------------
    @property
    def methods(self) -> list[str]:
        """The drafters' methods these statistics count (:attr:`method` split), in the order they came."""
        return [] if self.method is None else self.method.split(", ")

    def _add_method(self, method: str) -> None:
        """List ``method`` in :attr:`method` unless it is there."""
        if method not in self.methods:
            self.method = method if self.method is None else f"{self.method}, {method}"

    @property
    def new_tokens(self) -> int:
        return self.num_emitted_tokens

    @property
    def acceptance_rate(self) -> float:
        """Accepted over drafted tokens (0.0 when nothing was drafted)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Emitted tokens per target forward after the prefill (bonus/correction token included)."""
        steps = self.num_row_steps - self.num_sequences
        return (self.num_emitted_tokens - self.num_sequences) / steps if steps > 0 else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        """Accepted over drafted tokens at each draft position, up to the deepest position any draft reached
        (positions past it had nothing drafted, where the rate is undefined: not listed)."""
        depth = max((i + 1 for i, d in enumerate(self.drafted_per_position) if d), default=0)
        return [a / d if d else 0.0 for a, d in zip(self.accepted_per_position[:depth], self.drafted_per_position)]

    @property
    def tpot_s(self) -> float:
        """Seconds per output token after each sequence's first: the seconds every sequence spent after its first
        token over the tokens it emitted then, summed over the sequences of a batch and of merged calls (per
        sequence: its own TPOT; a batch's rows decode at the same time, so a batch's wall time over all its
        tokens would be less than any row's)."""
        return self.decode_s / self.decode_tokens if self.decode_tokens else 0.0

    @property
    def mean_ttft_s(self) -> float:
        """Seconds to the first token per call: :attr:`ttft_s` over :attr:`num_calls` (0.0 before any call)."""
        return self.ttft_s / self.num_calls if self.num_calls else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.num_emitted_tokens / self.total_s if self.total_s > 0 else 0.0

    @property
    def system_efficiency(self) -> float:
        """Emitted tokens over the most that the drafts allowed (vLLM's system efficiency): per step, the drafted
        chain's length (a tree's depth: one path of it can be accepted) plus the target's own token."""
        steps = self.num_row_steps - self.num_sequences
        best = sum(self.drafted_per_position) + steps
        return (self.num_emitted_tokens - self.num_sequences) / best if best > 0 else 0.0

    def merge(self, other: "SpecStats") -> "SpecStats":
        """Add another call's counters into this one (times add up; TTFT keeps the sum too, :attr:`mean_ttft_s`
        is the mean per call; ``per_row`` is not merged)."""
        for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_emitted_tokens",
                     "num_target_forwards", "num_row_steps", "num_sequences", "num_prompt_tokens", "num_calls", "ttft_s", "total_s", "decode_s",
                     "decode_tokens", "draft_time_s", "verify_time_s"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self._grow(len(other.drafted_per_position))
        for i, (a, d, r) in enumerate(zip(other.accepted_per_position, other.drafted_per_position,
                                          other.reached_per_position)):
            self.accepted_per_position[i] += a
            self.drafted_per_position[i] += d
            self.reached_per_position[i] += r
        self.k_per_step += other.k_per_step
        self.positions_per_step += other.positions_per_step
        self.policy_events += other.policy_events
        for method in other.methods:
            self._add_method(method)
        for source, counts in other.per_source.items():
            mine = self.per_source.setdefault(source, dict.fromkeys(counts, 0))
            for key, value in counts.items():
                mine[key] += value
        return self

    def to_dict(self) -> dict:
        """All counters plus the derived values, JSON-ready."""
        d = asdict(self)
        d["per_row"] = {row: stats.to_dict() for row, stats in self.per_row.items()}
        for name in ("new_tokens", "acceptance_rate", "mean_accepted_length", "acceptance_by_position",
                     "mean_ttft_s", "tpot_s", "tokens_per_s", "system_efficiency"):
            d[name] = getattr(self, name)
        return d

    def summary(self) -> str:
        """One line: tokens, seconds and tokens/s (all calls), acceptance rate, mean accepted length, TTFT (the
        mean per call, with the number of calls where there are several) and TPOT."""
        calls = f" (mean of {self.num_calls} calls)" if self.num_calls > 1 else ""
        return (
            f"{self.new_tokens} tokens in {self.total_s:.2f}s ({self.tokens_per_s:.2f} tok/s), "
            f"acceptance {self.acceptance_rate:.1%}, mean accepted length {self.mean_accepted_length:.2f}, "
            f"TTFT {self.mean_ttft_s * 1000:.0f} ms{calls}, TPOT {self.tpot_s * 1000:.0f} ms"
        )
