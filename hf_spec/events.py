"""Events that the decoding loop emits, once per target forward.

Every consumer (statistics, streaming, the demo, the benchmark) reads these and nothing else, so the
numbers they show agree by construction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

__all__ = ["StepEvent", "EventListener"]


@dataclass
class StepEvent:
    """What one target forward did, for each batch row still running.

    Attributes:
        step: 0 for the prefill forward, then 1, 2, ...
        num_speculative_tokens: the k the drafter was asked for in this step: the call's or the controller's,
            capped where ``max_new_tokens`` leaves less; 0 for the prefill and for plain steps.
        drafted: per row, the drafted token ids that were verified (may be shorter than k, or empty).
        num_accepted: per row, how many drafted tokens were accepted and emitted; always
            ``len(emitted) - 1`` or less (when a stop ends the row inside the accepted run, the last kept
            token counts as the target's own token of this forward, which chose it too).
        emitted: per row, every token appended to the sequence in this step: the accepted drafted tokens,
            then the target's own token (the correction, or the bonus token when the whole draft was
            accepted); shorter when EOS, ``max_new_tokens`` or a stopping criterion ended the row inside it.
        draft_time_s: wall time spent drafting, in seconds (less any one-time kernel measurement in it:
            :func:`hf_spec.kernels.measuring_seconds`).
        verify_time_s: wall time of the target forward and the acceptance rule, in seconds (less any one-time
            kernel measurement in it).
        time_s: seconds since the start of the generate call, at the end of this step.
        finished: per row, whether the row is done after this step.
        policy: optional decision record (from the adaptive policy), e.g. ``{"k": 3, "reason": "..."}``.
        rows: the original batch index of each listed row (finished rows leave the batch, so after the
            first one ends the lists are shorter than the batch); ``None`` means ``0..len-1``.
        sources: per row, which source drafted it, for drafters with several (the hybrid drafter:
            ``"suffix"``, ``"draft"``, ``"medusa"``, and ``"draft+suffix"`` / ``"medusa+suffix"`` for a model tree
            with the suffix proposal folded in); ``None`` otherwise.
        parents: for a draft tree, per row the parent of each node in ``drafted`` (``-1``: the root); the
            accepted nodes are then the ``num_accepted`` first tokens of ``emitted`` along one root path.
            ``None`` for chains.
        positions: positions per row the target forward scored: 1 + the draft's width, which can exceed 1 + the
            longest row in ``drafted`` (a model draft as wide as a row that then took another source; rows cut at
            ``max_new_tokens``); 0 where not given (then read as 1 + the longest row).
        accepted_path: per row, the indices into ``drafted`` of the nodes whose tokens were emitted, root first
            (a chain: ``0, 1, ...``): the ``num_accepted`` accepted ones, and one more where a stop ended the row
            on an accepted drafted token (then ``len(accepted_path[i]) == len(emitted[i])``: no token of the
            target's follows). The loop always sets it; ``None`` (hand-built events) reads as a chain's first
            ``num_accepted`` nodes.
        method: the drafter's :attr:`~hf_spec.drafters.base.Drafter.method` (its label in statistics and metrics);
            ``None`` without a drafter (plain decoding) and in hand-built events.
        prompt_tokens: at step 0, per row, its prompt's tokens (without its left padding); ``None`` after it and
            in hand-built events.
        finish_reasons: per row, vLLM's finish reason once ``finished``: ``"length"`` (``max_new_tokens`` or
            ``max_length`` reached: checked before EOS, as vLLM's scheduler does), ``"stop"`` (EOS, a stop string,
            also on the last allowed token as vLLM's detokenizer says, or another stopping criterion),
            ``"abort"`` (the call raised first: see ``aborted``); ``None`` for a row still running. ``None`` in
            hand-built events.
        aborted: ``True`` for the event the loop sends each of the caller's ``event_listeners`` when the call
            raises after handing it an event (an exception, ``KeyboardInterrupt``, a listener's own error): the
            rows still running after the last event that listener was handed, each ``finished`` with reason
            ``"abort"``, nothing drafted or emitted, no target forward; then the error propagates.
            A listener counting forwards or tokens skips it (:class:`~hf_spec.metrics.SpecStats` does).
    """

    step: int
    num_speculative_tokens: int
    drafted: list[list[int]]
    num_accepted: list[int]
    emitted: list[list[int]]
    draft_time_s: float
    verify_time_s: float
    time_s: float
    finished: list[bool]
    policy: dict | None = field(default=None)
    rows: list[int] | None = field(default=None)
    sources: list[str] | None = field(default=None)
    parents: list[list[int]] | None = field(default=None)
    positions: int = 0
    accepted_path: list[list[int]] | None = field(default=None)
    method: str | None = field(default=None)
    prompt_tokens: list[int] | None = field(default=None)
    finish_reasons: list[str | None] | None = field(default=None)
    aborted: bool = False


EventListener = Callable[[StepEvent], None]
