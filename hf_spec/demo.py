"""The Gradio demo: speculative decoding shown token by token, live, beside plain decoding's speed.

``hf-spec demo`` (or ``python demo/app.py``) serves it on a loopback port. Each step of the loop arrives as a
:class:`~hf_spec.events.StepEvent` (the same events that feed the statistics and the benchmark) and is drawn
at once: the drafter's accepted tokens, its rejected tokens struck through, and the target's own token (the
correction that replaces them, or the bonus token after a fully accepted draft), each in its own colour.
Beside it: acceptance rate, mean accepted length, tokens/s, acceptance by position, the k of each step, and
the speedup over plain decoding of the same prompt.

The speedup is measured, not estimated: after the speculative stream, plain ``generate`` runs on the same
prompt and settings (not at the same time: on a small CPU two generations at once would each run at about
half speed) and its tokens/s is kept per prompt and settings, so asking again shows both rates at once. The CPU
time other processes took while each ran (:class:`~hf_spec.device.OtherCpu`) is checked as ``generate --compare``
checks it: a warning under the speedup where it passed a tenth of the cores.

One generation at a time: requests are queued one at a time (``default_concurrency_limit=1``) and every
generation also holds :attr:`DemoModels.lock`, because Gradio frees the queue slot of a request whose browser
went away before the leftover generation has stopped. The Stop button sets the page's running generation's
stop flag, which the loop reads as a transformers ``StoppingCriteria`` after every token, so at most one more
token is generated and the run ends as a finished event (status "stopped"); a closed tab or a reload ends the
request's generator (Gradio closes it), whose cleanup sets the same flag. ``--log FILE`` records every run
(start, cancel, end) as JSON lines.
"""

import html
import itertools
import json
import queue
import threading
import time
from collections import OrderedDict, deque
from contextlib import closing
from dataclasses import dataclass, field

import torch
from transformers import StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from .bench.report import contention_warning, seconds_to_shares
from .device import OtherCpu
from .events import StepEvent
from .metrics import SpecStats

__all__ = ["render_tokens", "render_step", "render_tree", "TokenTexts", "build_app", "main", "DemoModels", "RunLog",
           "stream"]

MAX_NEW_TOKENS = 1024
K_CHOICES = ["auto"] + [str(k) for k in range(1, 13)]
#: the page's draft tree sizes (num_tree_nodes), for the drafters that draft trees (draft model, Medusa, suffix,
#: hybrid); 6 is the size ``"auto"`` measures beside the chain
TREE_CHOICES = ["none", "auto", "6", "8", "16", "32"]
#: the page's drafters, by label; those not loaded (:func:`load_models`) are left off the page
METHODS = ["draft model", "hybrid", "suffix", "medusa", "n-gram", "none"]
#: plain decoding results kept (prompt and settings -> tokens/s); the oldest is dropped first
PLAIN_CACHE_SIZE = 64
#: seconds the page's generator waits for news before it yields a no-op update, so that Gradio can close
#: it (a generator is closed only between two of its yields) within that long of a disconnect or Stop
IDLE_YIELD_S = 0.25

CSS = """
.hfspec-out {font-family: ui-monospace, monospace; white-space: pre-wrap; line-height: 1.6; font-size: 14px;}
.hfspec-acc {background: #c8f7c5; color: #0b4d07;}
.hfspec-rej {background: #ffd0d0; color: #8a0000; text-decoration: line-through;}
.hfspec-fix {background: #cfe0ff; color: #0a2f7a;}
.hfspec-bonus {background: #ead1ff; color: #4b0a7a;}
.hfspec-legend span {padding: 1px 6px; margin-right: 8px; border-radius: 3px;}
.hfspec-tree ul {margin: 0; padding-left: 1.4em; list-style: "\2514  ";}
"""

LEGEND = ('<div class="hfspec-legend"><span class="hfspec-acc">accepted draft token</span>'
          '<span class="hfspec-rej">rejected draft token</span>'
          '<span class="hfspec-fix">target token (prefill or correction)</span>'
          '<span class="hfspec-bonus">bonus token (whole draft accepted)</span></div>')


def _span(kind: str, text: str) -> str:
    return f'<span class="hfspec-{kind}">{html.escape(text)}</span>'


def _step_tree(ev: StepEvent) -> tuple[list[int], list[int], list[int], bool]:
    """Row 0 of a step as a tree: ``(drafted, parents, path, cut)``, a chain being the tree whose node j has parent
    j - 1; ``path`` the nodes whose tokens were emitted, root first (the event's ``accepted_path``).

    ``cut``: a stop (EOS, ``max_new_tokens``, a stop string) ended the row on an accepted drafted token (the
    event counts it as the target's own, :class:`~hf_spec.events.StepEvent`): it is the path's last node, no
    token of the target's follows, and the draft below it was cut, not rejected."""
    drafted = ev.drafted[0]
    parents = ev.parents[0] if ev.parents else list(range(-1, len(drafted) - 1))
    path = ev.accepted_path[0] if ev.accepted_path is not None else list(range(ev.num_accepted[0]))
    return drafted, parents, path, bool(path) and len(path) == len(ev.emitted[0])


class TokenTexts:
    """The text of each generated token as the page shows it, decoded in context: a character that a byte-level
    tokenizer splits over several tokens (an emoji, most CJK characters) shows whole on the token that completes
    it, the tokens before it showing nothing (decoded alone, each would show U+FFFD), and a token keeps the
    leading space that a SentencePiece tokenizer drops at the start of a text. ``"".join`` of the texts is the
    decoded sequence (less a character still incomplete at its end).

    ``decode`` maps a list of token ids to its text (the tokenizer's ``decode``).
    """

    #: tokens held at most for one character (UTF-8 has at most 4 bytes; a tokenizer may split them further)
    MAX_HELD = 8

    def __init__(self, decode):
        self.decode = decode
        self.ids: list[int] = []
        self.held = 0  # trailing ids whose text is not shown yet (an incomplete character)

    def _text(self, ids: list[int]) -> str:
        """The text of ``ids`` after the sequence's shown part: decoded after the token before them."""
        start = len(self.ids) - self.held
        before = self.ids[start - 1:start]
        text = self.decode(before + ids)
        if before:
            head = self.decode(before)
            text = text[len(head):] if text.startswith(head) else text
        return text

    def push(self, token: int) -> str:
        """Append a token of the sequence; its text ("" while the character it begins is incomplete)."""
        text = self._text(self.ids[len(self.ids) - self.held:] + [token])
        self.ids.append(token)
        if text.endswith("\ufffd") and self.held < self.MAX_HELD:
            self.held += 1
            return ""
        self.held = 0
        return text

    def flush(self) -> str:
        """The text of the tokens still held, at the end of the output (U+FFFD for a character cut there)."""
        text = self._text(self.ids[len(self.ids) - self.held:]) if self.held else ""
        self.held = 0
        return text

    def candidates(self, ids: list[int]) -> list[str]:
        """The texts that a run of drafted tokens (a rejected chain's rest, or one rejected tree node) would have
        after the sequence so far, each after the ones before it, as :meth:`push` would give them; the sequence
        itself does not change. A character the held tokens began shows on the candidate that completes it."""
        trial = TokenTexts(self.decode)
        trial.ids, trial.held = list(self.ids), self.held
        out = [trial.push(t) for t in ids]
        if out:
            out[-1] += trial.flush()
        return out

    def join(self, ids) -> str:
        """Push ``ids`` and return their texts joined, a character cut at the end included (the run log's text, as
        the page shows it)."""
        return "".join(self.push(t) for t in ids) + self.flush()


def render_step(ev: StepEvent, decode, texts: TokenTexts | None = None) -> str:
    """HTML of one step of one sequence (batch size 1), :func:`render_tokens`' part for ``ev``. With ``texts``
    (the sequence's :class:`TokenTexts`, which this advances) tokens are decoded in context, else each alone
    with ``decode`` (a token id to its text)."""
    parts = []
    show = texts.push if texts is not None else decode
    accepted, emitted = ev.num_accepted[0], ev.emitted[0]
    drafted, parents, path, cut = _step_tree(ev)
    for tok in emitted[:accepted + cut]:
        parts.append(_span("acc", show(tok)))
    if len(emitted) > accepted and not cut:
        below = path[-1] if path else -1
        rejected = [j for j, p in enumerate(parents) if p == below]  # the candidates after the accepted ones
        if not ev.parents:  # a chain: the whole rest of it
            rejected = list(range(len(path), len(drafted)))
        if texts is None:
            words = [decode(drafted[j]) for j in rejected]
        elif not ev.parents:  # a chain's rest: each token after the ones before it
            words = texts.candidates([drafted[j] for j in rejected])
        else:  # a tree's candidates: alternatives, each after the accepted path
            words = [texts.candidates([drafted[j]])[0] for j in rejected]
        parts += [_span("rej", word) for word in words]
        kind = "bonus" if drafted and not any(p == below for p in parents) else "fix"
        parts.append(_span(kind, show(emitted[accepted])))
    return "".join(parts)


def render_tokens(events: list[StepEvent], decode, texts: TokenTexts | None = None) -> str:
    """HTML of one sequence's steps (batch size 1): per step the accepted drafted tokens, the rejected ones
    struck through (a chain's rest; a tree's candidates where its accepted path stopped), then the target's
    token (correction, or bonus where the whole path to a leaf was accepted). ``decode`` maps a token id to its
    text; with ``texts`` (a fresh :class:`TokenTexts`) tokens are decoded in context instead."""
    return '<div class="hfspec-out">' + "".join(render_step(ev, decode, texts) for ev in events) + "</div>"


def render_tree(event: StepEvent | None, decode, decode_ids=None) -> str:
    """HTML of one step's draft (row 0) as a tree: each node under its parent, the accepted path in green, the
    rest struck through, the target's own token after the path; a chain shows as a tree of one branch. Empty
    for no step or a step that drafted nothing. ``decode`` maps a token id to its text; with ``decode_ids`` (a list
    of ids to its text: the tokenizer's ``decode``) each node is decoded after its ancestors instead, so that a
    character split over several nodes shows whole on the node that completes it (the nodes before it empty)."""
    if event is None or not event.drafted[0]:
        return ""
    drafted, parents, path, cut = _step_tree(event)
    on_path = set(path)
    if decode_ids is not None:
        decode = _in_context(drafted, parents, decode_ids)

    def subtree(parent: int) -> str:
        if cut and parent == path[-1]:  # the draft below the row's last token was cut by the stop: not shown
            return ""
        items = []
        for j in (j for j, p in enumerate(parents) if p == parent):
            label = _span("acc" if j in on_path else "rej", decode(drafted[j], j) if decode_ids else decode(drafted[j]))
            items.append(f"<li>{label}{subtree(j)}</li>")
        return f"<ul>{''.join(items)}</ul>" if items else ""

    emitted = event.emitted[0]
    last = path[-1] if path else -1
    target = None
    if len(emitted) > event.num_accepted[0] and not cut:
        token = emitted[event.num_accepted[0]]
        target = decode(token, last, after=True) if decode_ids else decode(token)
    after = f" then the target's token {_span('fix', target)}" if target is not None else ""
    return (f'<div class="hfspec-out hfspec-tree">step {event.step}: {len(drafted)} drafted node'
            f'{"s" if len(drafted) != 1 else ""}, {len(path)} accepted{after}{subtree(-1)}</div>')


def _in_context(drafted: list[int], parents: list[int], decode_ids):
    """``text(token, node, after=False)``: the text of drafted node ``node`` (or, with ``after``, of ``token`` after
    ``node``, -1: the root) as :class:`TokenTexts` gives it after the node's ancestors: "" while the character it
    begins is incomplete and a child may complete it, U+FFFD where nothing does."""
    def text(token: int, node: int, after: bool = False) -> str:
        path, up = [], node if after else parents[node]
        while up >= 0:
            path.append(drafted[up])
            up = parents[up]
        texts = TokenTexts(decode_ids)
        for t in reversed(path):  # the ancestors, root first; a character they began stays held
            texts.push(t)
        shown = texts.push(token)
        return shown if not after and any(p == node for p in parents) else shown + texts.flush()
    return text


def _stats_markdown(stats: SpecStats, plain: dict | None = None, load: dict | None = None) -> str:
    """The statistics table: the speculative run's counters, and beside its tokens/s plain decoding's (running,
    measured, or from the cache) and the speedup once plain decoding is complete, with
    :func:`~hf_spec.bench.contention_warning`'s warning under it where other processes took CPU while either was
    timed (``load``: ``{"speculative decoding": (other_s, steal_s, wall_s)}`` from :class:`~hf_spec.device.OtherCpu`;
    plain decoding's figures are in ``plain["load"]``, kept with a cached measurement)."""
    spec_tps = stats.tokens_per_s
    lines = []
    if plain and plain.get("done") and plain["tokens_per_s"] > 0:
        lines.append(f"**Speedup {spec_tps / plain['tokens_per_s']:.2f}x**: {spec_tps:.2f} tokens/s speculative, "
                     f"{plain['tokens_per_s']:.2f} tokens/s plain decoding"
                     + (" (measured earlier on this server, same prompt and settings)" if plain.get("cached") else "")
                     + "\n")
        figures = {**(load or {}), **({"plain decoding": plain["load"]} if plain.get("load") else {})}
        warning = contention_warning(seconds_to_shares(figures))
        if warning:
            lines.append(f"**Warning**: {warning}\n")
    if plain and plain.get("difference") is not None:  # a greedy run compared token by token
        same = "yes" if not plain["difference"] else "no, " + plain["difference"]
        lines.append(f"**Identical to plain decoding**: {same}\n")
    lines += ["| measure | value |", "|---|---|",
              f"| new tokens | {stats.num_emitted_tokens} |",
              f"| acceptance rate | {stats.acceptance_rate:.1%} |",
              f"| mean accepted length | {stats.mean_accepted_length:.2f} |",
              f"| target forwards | {stats.num_target_forwards} |",
              f"| tokens/s | {spec_tps:.2f} |",
              f"| TTFT | {stats.ttft_s:.2f} s |"]
    if stats.k_per_step:
        off = stats.k_per_step.count(0)
        lines.append(f"| k per step (last 10) | {' '.join(map(str, stats.k_per_step[-10:]))}"
                     f"{f' ({off} steps without speculation)' if off else ''} |")
    if plain:
        state = "cached" if plain.get("cached") else "measured" if plain.get("done") else "running"
        lines.append(f"| plain decoding ({state}) | {plain['tokens']} tokens, {plain['tokens_per_s']:.2f} tokens/s |")
    return "\n".join(lines)


def _difference(models: "DemoModels", prompt: torch.Tensor, plain_ids: list[int], speculative_ids: list[int]) -> str:
    """For a greedy run: ``""`` where the speculative output is plain decoding's (one a prefix of the other: a
    stop), else where it first differs, the target's logit gap there and whether the compute's rounding explains it
    (:mod:`hf_spec.divergence`, as ``hf-spec generate --compare`` says it; one target forward, holding
    :attr:`DemoModels.lock`)."""
    from .divergence import first_difference, near_tie_verdict

    with models.lock:
        diff = first_difference(models.target, models.tokenizer, prompt, torch.tensor(plain_ids),
                                torch.tensor(speculative_ids))
    if diff is None:
        return ""
    verdict = near_tie_verdict(diff["logit_gap"], models.target, models.target.dtype)
    return (f"the outputs differ from new token {diff['new_token']} on ({diff['plain']!r} plain, "
            f"{diff['speculative']!r} speculative; logit gap {diff['logit_gap']:.3g}): {verdict}")


def _acceptance_plot(stats: SpecStats):
    """A small matplotlib bar chart of acceptance by draft position (fixed margins: a tight layout would cost
    several times the drawing, on the cores the generation runs on)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    acc = stats.acceptance_by_position
    fig, ax = plt.subplots(figsize=(5, 2.2))
    ax.bar([str(i + 1) for i in range(len(acc))], acc, color="#4caf50")
    ax.set_ylim(0, 1)
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance")
    ax.set_title("Acceptance by draft position", fontsize=10)
    fig.subplots_adjust(left=0.14, right=0.98, bottom=0.25, top=0.86)
    plt.close(fig)
    return fig


def check_serving(host: str, port: int, log: str | None) -> None:
    """``hf-spec demo``'s ``--host``, ``--port`` and ``--log``, checked before any model loads: an address and port
    this process can listen on (a port in use, out of range or an address not of this machine failed with a
    traceback once the models had loaded), and a log file that can be appended to (a folder, or a file under a
    missing folder, failed at the first run). The log file is created if missing.

    Raises:
        ValueError: saying which flag, what failed and what to do.
    """
    import socket

    if not 1 <= port <= 65535:  # gradio takes no 0 ("any free port"): it serves nothing there
        raise ValueError(f"--port {port}: a port is 1 to 65535 (7860 by default)")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(address)
    except OSError as e:
        raise ValueError(f"cannot serve on {host}:{port} ({e}); choose another --port, or a --host of this machine "
                         "(127.0.0.1, or 0.0.0.0 for every interface)") from None
    if log is not None:
        try:
            with open(log, "a", encoding="utf-8"):
                pass
        except OSError as e:
            raise ValueError(f"--log {log}: cannot append to it ({e.strerror}); give a file in a folder you can "
                             "write to") from None


class RunLog:
    """What the demo ran: one record per run's start, cancel (its page went away or pressed Stop while it ran)
    and end, with the run's phase (``speculative`` or ``plain``) and how many new tokens that phase had.

    Records are kept in memory (the last ``keep``) and, with ``path`` (``--log FILE``), appended to that file
    as JSON lines, in the order they happened.
    """

    def __init__(self, path: str | None = None, keep: int = 1000):
        self.path = path
        self.records: deque = deque(maxlen=keep)
        self._lock = threading.Lock()

    def write(self, event: str, run: int, **fields) -> None:
        record = {"event": event, "run": run, "time": round(time.time(), 3), **fields}
        with self._lock:
            self.records.append(record)
            if self.path:
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(record) + "\n")


@dataclass
class DemoModels:
    """What the demo serves: the target, its tokenizer, its drafters by the label the page shows, and what
    the requests share.

    The drafters are built once (:func:`load_models`, through the drafter registry) and shared by every
    request: a generate call works on its own bound copy of a drafter and passes k per call, so requests never
    change one another's drafter. ``lock`` is held by a generation from its first forward to its last, so two
    never run on the models at once; ``plain_cache`` keeps plain decoding's measurement per prompt and settings
    (at most :data:`PLAIN_CACHE_SIZE`); ``log`` records every run.
    """

    target: object
    tokenizer: object
    drafters: dict = field(default_factory=dict)  # label in METHODS -> Drafter
    names: dict = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    plain_cache: OrderedDict = field(default_factory=OrderedDict)
    log: RunLog = field(default_factory=RunLog)
    run_ids: itertools.count = field(default_factory=lambda: itertools.count(1))
    running: dict = field(default_factory=dict)  # page session -> its latest run (what Stop stops)

    def stop(self, session: str) -> int | None:
        """Stop the page ``session``'s running generation (the Stop button); the id of the run it stopped."""
        run = self.running.get(session)
        return run.id if run is not None and run.cancel(self.log) else None

    def drafter(self, method: str):
        """The drafter for a page label (``None`` for ``"none"``).

        Raises:
            ValueError: an unknown label, or one whose model was not loaded.
        """
        if method == "none":
            return None
        if method not in METHODS:
            raise ValueError(f"unknown drafter {method!r}; choose one of {', '.join(METHODS)}")
        if method not in self.drafters:
            flag = {"draft model": "--draft NAME", "hybrid": "--draft NAME", "medusa": "--medusa DIR|NAME"}.get(method, "")
            raise ValueError(f"no {method} drafter loaded: start the demo with {flag}")
        return self.drafters[method]


def _number(value, name: str, kind=float):
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}.") from None


def _check(prompt: str, k, max_new_tokens, temperature, top_p) -> tuple:
    """Validate the form; raise ValueError with a message for the page."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("Empty prompt: type a question or some code first.")
    if str(k) not in K_CHOICES:
        raise ValueError(f"k must be auto or an integer from 1 to 12, got {k!r}.")
    k = "auto" if str(k) == "auto" else int(k)
    max_new = _number(max_new_tokens, "Max new tokens")
    if not 1 <= max_new <= MAX_NEW_TOKENS or max_new != int(max_new):
        raise ValueError(f"Max new tokens must be a whole number between 1 and {MAX_NEW_TOKENS}, got {max_new_tokens}.")
    temperature = _number(0.0 if temperature is None else temperature, "Temperature")
    top_p = _number(1.0 if top_p is None else top_p, "Top-p")
    if not 0 <= temperature <= 2:
        raise ValueError(f"Temperature must be between 0 (greedy) and 2, got {temperature}.")
    if not 0 < top_p <= 1:
        raise ValueError(f"Top-p must be in (0, 1], got {top_p}.")
    return k, int(max_new), temperature, top_p


class _Run(StoppingCriteria):
    """One request's generation: its stop flag, read as a stopping criterion after every new token (by the
    speculative loop and by plain ``generate`` alike), and how far its current phase has got."""

    def __init__(self, run_id: int, prompt_len: int):
        self.id = run_id
        self.prompt_len = prompt_len
        self.stop = threading.Event()
        self.phase = "waiting"
        self.tokens = 0  # new tokens of the current phase, as the last stopping check saw them
        self.done = False
        self.text = None  # the speculative output as the page shows it, once complete
        self.lock = threading.Lock()  # orders the cancel record before the end record

    def cancel(self, log: "RunLog") -> bool:
        """Set the stop flag of a run that has not ended and record the cancel; whether it had not ended."""
        with self.lock:
            if self.done:
                return False
            self.stop.set()  # then read the count: the generation keeps at most one more token
            log.write("cancel", self.id, phase=self.phase, tokens=self.tokens)
            return True

    def __call__(self, input_ids, scores, **kwargs):
        self.tokens = input_ids.shape[-1] - self.prompt_len  # before reading the flag: see stream()'s cleanup
        return torch.full((input_ids.shape[0],), self.stop.is_set(), dtype=torch.bool, device=input_ids.device)


class _PlainStreamer(BaseStreamer):
    """Passes plain ``generate``'s new tokens to the page's queue, with the time each arrived (the first
    ``put`` is the prompt: the clock starts there, as the speculative loop's does)."""

    def __init__(self, out: queue.Queue):
        self.out, self.t0 = out, None

    def put(self, value):
        if self.t0 is None:
            self.t0 = time.perf_counter()
            return
        self.out.put(("plain", value.reshape(-1).tolist(), time.perf_counter() - self.t0))

    def end(self):
        pass


def _work(models: DemoModels, run: _Run, inputs, kwargs: dict, plain: bool, record: dict, out: queue.Queue) -> None:
    """One request's generations, on their own thread: the speculative one (``kwargs``: drafter, k, sampling,
    max new tokens), then with ``plain`` plain decoding of the same prompt, both holding ``models.lock``.
    Tells the page through ``out`` (``None`` last) and the run log (``record``: what the start record says).
    After each generation ``("load", phase, (other_s, steal_s, wall_s))``: the CPU time other processes and the
    hypervisor took while it ran (:class:`~hf_spec.device.OtherCpu`), which the speedup line is checked against;
    the end record has their share of the cores per phase (``other_cpu_cores``)."""
    from .loop import generate as spec_generate

    tok = models.tokenizer
    timed = {}  # phase -> OtherCpu's (other_s, steal_s, wall_s) while it ran
    if not models.lock.acquire(blocking=False):
        out.put(("waiting",))
        models.lock.acquire()
    try:
        models.log.write("start", run.id, **record)
        if run.stop.is_set():  # its page went away while it waited
            return
        run.phase, run.tokens = "speculative", 0
        out.put(("phase", "speculative"))
        with OtherCpu() as other:
            res = models.target.generate(**inputs, custom_generate=spec_generate, return_dict_in_generate=True,
                                         event_listeners=[lambda ev: None if ev.aborted else out.put(("step", ev))],
                                         stopping_criteria=StoppingCriteriaList([run]), tokenizer=tok, **kwargs)
        timed["speculative"] = (other.other_s, other.steal_s, other.wall_s)
        out.put(("load", "speculative", timed["speculative"]))
        run.text = TokenTexts(tok.decode).join(res.sequences[0, run.prompt_len:].tolist())
        if not plain or run.stop.is_set():
            return
        run.phase, run.tokens = "plain", 0
        out.put(("phase", "plain"))
        plain_kwargs = {k: v for k, v in kwargs.items() if k not in ("drafter", "num_speculative_tokens",
                                                                      "num_tree_nodes")}
        with OtherCpu() as other:
            models.target.generate(**inputs, streamer=_PlainStreamer(out),
                                   stopping_criteria=StoppingCriteriaList([run]), tokenizer=tok, **plain_kwargs)
        timed["plain"] = (other.other_s, other.steal_s, other.wall_s)
        out.put(("load", "plain", timed["plain"]))
        out.put(("plain_done", run.stop.is_set()))
    except Exception as e:  # shown in the page
        out.put(("error", e))
    finally:
        with run.lock:
            run.done = True
            models.log.write("end", run.id, phase=run.phase, tokens=run.tokens, stopped=run.stop.is_set(),
                             **({"text": run.text} if run.text is not None else {}),
                             other_cpu_cores={phase: round(share[0], 4)
                                              for phase, share in seconds_to_shares(timed).items()})
        models.lock.release()
        out.put(None)


def stream(models: DemoModels, prompt: str, method: str, k, temperature: float, top_p: float, max_new_tokens: int,
           compare: bool = True, session: str = "", tree="none"):
    """Run one request and yield ``(tokens_html, stats_markdown, acceptance_plot, plain_text, status, tree_html)``
    as its steps arrive (``tree_html``: the latest step's draft as a tree, :func:`render_tree`), or ``None`` when
    nothing is new for :data:`IDLE_YIELD_S` seconds. ``tree``: one of :data:`TREE_CHOICES` (``num_tree_nodes``;
    ``"none"``: chains).

    The generation runs on its own thread (:func:`_work`). Closing this generator (Gradio does when the page
    goes away or Stop is pressed) sets the run's stop flag: the generation ends after at most one more token.
    With ``compare``, plain decoding of the same prompt and settings follows the speculative run, unless
    :attr:`DemoModels.plain_cache` has it already.

    Raises:
        ValueError: bad input, before any model runs.
        RuntimeError: the generation failed.
    """
    from .loop import generated_length, plan_num_speculative_tokens
    from .prompts import chat_inputs, check_context

    k, max_new_tokens, temperature, top_p = _check(prompt, k, max_new_tokens, temperature, top_p)
    drafter = models.drafter(method)
    plan_num_speculative_tokens(k, drafter)  # k above what the drafter can propose: a message before any work
    if str(tree) not in TREE_CHOICES:
        raise ValueError(f"Draft tree must be one of {', '.join(TREE_CHOICES)}, got {tree!r}.")
    tree = 0 if str(tree) == "none" else "auto" if str(tree) == "auto" else int(tree)
    if tree and (drafter is None or not drafter.drafts_trees):
        raise ValueError(f"The {method} drafter drafts chains only: choose draft tree none, or the draft model, "
                         "Medusa, suffix or hybrid drafter.")
    tok = models.tokenizer
    inputs = chat_inputs(tok, prompt)
    check_context(models.target, inputs["input_ids"].shape[1], max_new_tokens)  # a run past it writes garbage
    sampling = dict(do_sample=True, temperature=temperature, top_p=top_p) if temperature > 0 else \
        dict(do_sample=False, temperature=None, top_p=None, top_k=None)
    key = (prompt, max_new_tokens, temperature, top_p)
    cached = models.plain_cache.get(key) if compare else None
    if cached:
        models.plain_cache.move_to_end(key)
    run = _Run(next(models.run_ids), inputs["input_ids"].shape[1])
    out: queue.Queue = queue.Queue()
    kwargs = dict(drafter=drafter, num_speculative_tokens=k if drafter is not None else None,
                  max_new_tokens=max_new_tokens, **sampling, **({"num_tree_nodes": tree} if tree else {}))
    record = dict(session=session, prompt=prompt, method=method, k=k, tree=tree, max_new_tokens=max_new_tokens,
                  temperature=temperature, top_p=top_p, plain="cached" if cached else "measure" if compare else "no")
    worker = threading.Thread(target=_work, args=(models, run, inputs, kwargs, compare and cached is None, record,
                                                  out), daemon=True)
    decode = lambda t: tok.decode([t])  # noqa: E731
    seen: list[StepEvent] = []
    texts = TokenTexts(tok.decode)  # the output's tokens decoded in context (characters split over tokens)
    shown: list[str] = []  # each step's HTML, drawn once when it arrives
    stats = SpecStats()
    plot, plotted = None, 0  # the plot and the number of steps it shows
    plain_ids: list[int] = []
    plain = dict(cached, cached=True) if cached else None
    load: dict = {}  # {"speculative decoding": OtherCpu's figures}; plain decoding's go into plain["load"]
    plain_text = cached["text"] if cached else ""
    status = f"run {run.id}: queued"
    error = None
    last = last_plot = 0.0

    def update():
        last_draft = next((ev for ev in reversed(seen) if ev.drafted[0]), None)
        return (LEGEND + '<div class="hfspec-out">' + "".join(shown) + "</div>", _stats_markdown(stats, plain, load), plot,
                plain_text, status, render_tree(last_draft, decode, tok.decode))

    models.running[session] = run
    worker.start()
    try:
        while True:
            try:
                msg = out.get(timeout=IDLE_YIELD_S)
            except queue.Empty:
                yield None
                continue
            if msg is None:
                break
            kind = msg[0]
            if kind == "waiting":
                status = f"run {run.id}: waiting for the previous generation to stop"
            elif kind == "phase":
                status = f"run {run.id}: " + ("speculative decoding" if msg[1] == "speculative" else
                                              "plain decoding of the same prompt, for the speedup")
            elif kind == "step":
                seen.append(msg[1])
                shown.append(render_step(msg[1], decode, texts))
                stats(msg[1])
            elif kind == "plain":
                plain_ids += msg[1]
                plain_text = tok.decode(plain_ids, skip_special_tokens=True)
                plain = dict(tokens=len(plain_ids), tokens_per_s=len(plain_ids) / msg[2] if msg[2] > 0 else 0.0,
                             done=False, text=plain_text)
            elif kind == "load":
                if msg[1] == "speculative":
                    load["speculative decoding"] = msg[2]
                elif plain is not None:
                    plain["load"] = msg[2]
            elif kind == "plain_done" and plain is not None and not msg[1]:  # complete: measured
                n = generated_length(plain_ids, models.target.generation_config.eos_token_id)
                plain = dict(plain, tokens=n, done=True, ids=plain_ids[:n])
                # kept for the next request with this prompt and these settings
                models.plain_cache[key] = dict(tokens=n, tokens_per_s=plain["tokens_per_s"], text=plain_text,
                                               done=True, load=plain.get("load"), ids=plain_ids[:n])
                while len(models.plain_cache) > PLAIN_CACHE_SIZE:
                    models.plain_cache.popitem(last=False)
            elif kind == "error":
                error = msg[1]
            now = time.perf_counter()
            if now - last > 0.05:
                last = now
                if stats.num_target_forwards != plotted and now - last_plot > 1.0:  # dearer to draw: once a second
                    last_plot, plotted, plot = now, stats.num_target_forwards, _acceptance_plot(stats)
                yield update()
        if error is not None:
            raise RuntimeError(f"Generation failed: {error}") from error
        rest = texts.flush()  # a character cut by the end of the output (max new tokens, Stop): shown as it is
        if rest:
            shown.append(_span("acc", rest))
        if stats.num_target_forwards != plotted:
            plot = _acceptance_plot(stats)
        if plain and plain.get("ids") is not None and not sampling["do_sample"] and not run.stop.is_set():
            speculative_ids = [t for event in seen for t in event.emitted[0]]
            plain = dict(plain, difference=_difference(models, inputs["input_ids"][0], plain["ids"], speculative_ids))
        status = f"run {run.id}: " + ("stopped" if run.stop.is_set() else "finished")
        yield update()
    finally:
        run.cancel(models.log)  # closed early (the page went away): stop the generation
        if models.running.get(session) is run:
            del models.running[session]


def _handler(models: DemoModels):
    """The Generate button's Gradio handler (API name ``/generate``): :func:`stream` for this page's session, each
    update with only the outputs that changed and the last one in full (a ``gradio_client`` caller's result), bad
    input as ``gr.Error`` (a message in the page), and closing it closes the stream (which stops the
    generation)."""
    import gradio as gr

    # Gradio passes the request to the parameter annotated gr.Request: a real annotation, so this module does
    # without `from __future__ import annotations`
    def on_generate(prompt, method, k, tree, temperature, top_p, max_new, compare, request: gr.Request):
        session = getattr(request, "session_hash", None) or ""
        sent = [None] * 6
        try:
            with closing(stream(models, prompt, method, k, temperature, top_p, max_new, compare, session,
                                tree)) as updates:
                for update in updates:
                    # only what changed: the plot is not drawn again, and an update still on its way when Stop
                    # is pressed does not overwrite the status line with its own
                    update = update or sent
                    yield tuple(gr.skip() if new is old or (type(new) is str and new == old) else new
                                for new, old in zip(update, sent))
                    sent = update
            # the last update in full: a gradio_client caller (api_name "/generate") gets the last update as the
            # result, where a skipped output would come as an empty update instead of its value
            yield tuple(sent)
        except ValueError as e:  # bad input: a message, no stack trace in the server's log
            raise gr.Error(html.escape(str(e)), title="Bad input", print_exception=False) from e
        except RuntimeError as e:
            raise gr.Error(html.escape(str(e)), title="Generation failed") from e

    return on_generate


def _stopper(models: DemoModels):
    """The Stop button's Gradio handler (API name ``/stop``): stops this page's (a ``gradio_client`` caller's: this
    client's) running generation (:meth:`DemoModels.stop`) and returns the status line: ``run N: stopping``, or
    that nothing of this session runs."""
    import gradio as gr

    def on_stop(request: gr.Request):
        stopped = models.stop(getattr(request, "session_hash", None) or "")
        if stopped is not None:
            return f"run {stopped}: stopping"
        return "nothing to stop: no generation of this session is running"

    return on_stop


def build_app(models: DemoModels):
    """The Gradio Blocks app (not launched)."""
    import gradio as gr

    methods = [m for m in METHODS if m == "none" or m in models.drafters]
    with gr.Blocks(title="hf-spec: speculative decoding, live", analytics_enabled=False) as app:
        gr.Markdown(f"## hf-spec: speculative decoding, live\nTarget **{models.names.get('target', '?')}**"
                    + (f", draft **{models.names['draft']}**" if models.names.get("draft") else "")
                    + (f", Medusa heads **{models.names['medusa']}**" if models.names.get("medusa") else "")
                    + ". Greedy output is token-identical to the target's own `generate`"
                    + ("" if getattr(models.target, "dtype", torch.float32) == torch.float32 else
                       f" up to {str(models.target.dtype).removeprefix('torch.')} rounding (a verify forward can "
                       "settle a near-tie the other way; `--dtype float32` for exact identity)")
                    + "; sampling keeps its distribution.")
        with gr.Row():
            with gr.Column(scale=1):
                prompt = gr.Textbox(label="Prompt", lines=4, elem_id="prompt",
                                    value="Write a Python function that checks whether a number is prime.")
                method = gr.Radio(methods, value=methods[0], label="Drafter", elem_id="method")
                k = gr.Dropdown(K_CHOICES, value="auto", label="k (num_speculative_tokens)", elem_id="k")
                tree = gr.Dropdown(TREE_CHOICES, value="none", elem_id="tree_size",
                                   label="Draft tree nodes (num_tree_nodes; none = a chain)")
                temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature (0 = greedy)")
                top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="Top-p")
                max_new = gr.Number(value=128, precision=0, label=f"Max new tokens (1-{MAX_NEW_TOKENS})",
                                    elem_id="max_new")
                compare = gr.Checkbox(value=True, elem_id="compare",
                                      label="Speedup: time plain decoding of the same prompt after it "
                                            "(once per prompt and settings, then remembered)")
                with gr.Row():
                    go = gr.Button("Generate", variant="primary", elem_id="generate")
                    halt = gr.Button("Stop", elem_id="stop")
            with gr.Column(scale=2):
                status = gr.Markdown(elem_id="status", label="Status")
                out = gr.HTML(LEGEND, elem_id="tokens", label="Tokens: accepted, rejected, bonus")
                stats = gr.Markdown(elem_id="stats", label="Statistics")
                tree_view = gr.HTML(elem_id="tree_view", label="The last step's draft")
                plot = gr.Plot(label="Acceptance by draft position", elem_id="acceptance_plot")
                plain = gr.Textbox(label="Plain decoding of the same prompt", lines=4, elem_id="plain")

        go.click(_handler(models), [prompt, method, k, tree, temperature, top_p, max_new, compare],
                       [out, stats, plot, plain, status, tree_view], api_name="generate")
        # Stop sets the run's own stop flag; the run then ends as any run does, with status "stopped" (not
        # Gradio's `cancels=`, which raced the run's last update and could leave the page showing "Error")
        halt.click(_stopper(models), None, [status], concurrency_limit=None, api_name="stop")
    app.queue(default_concurrency_limit=1)
    return app


def load_models(target: str, draft: str | None, medusa: str | None, dtype: str = "auto",
                device_map: str | None = None, log: str | None = None) -> DemoModels:
    """Load the target by short name, folder or hub name, and build its drafters with the drafter registry:
    n-gram lookup and the suffix drafter always, ``draft:DRAFT`` (and the hybrid drafter over it) and
    ``medusa:MEDUSA`` when named.

    Args:
        device_map: ``--device-map`` (:func:`hf_spec.device.resolve_device_map`; default: ``auto`` when CUDA is
            available, else ``cpu``); ``dtype="auto"`` decides for that device. Drafts go on the target's device.
        log: a file to append the run log to (:class:`RunLog`).

    Raises:
        ValueError: a bad drafter spec (e.g. no such Medusa heads) or device map, before the target loads.
    """
    from .device import resolve_device_map, resolve_dtype
    from .drafters.hybrid import HybridDrafter
    from .drafters.registry import make_drafter, parse_drafter
    from .drafters.suffix import SuffixDrafter
    from .models import load

    device_map = resolve_device_map(device_map)
    specs = {"draft model": f"draft:{draft}" if draft else None, "medusa": f"medusa:{medusa}" if medusa else None,
             "n-gram": "ngram"}
    parsed = {label: parse_drafter(spec) for label, spec in specs.items() if spec}  # fail before loading
    model, tok = load(target, dtype=resolve_dtype(dtype, device_map), device_map=device_map)
    drafters = {label: make_drafter(spec, target=model, tokenizer=tok) for label, spec in parsed.items()}
    drafters["suffix"] = SuffixDrafter()
    if "draft model" in drafters:  # the same draft model in memory once
        drafters["hybrid"] = HybridDrafter(drafters["draft model"])
    names = {"target": target} | ({"draft": draft} if draft else {}) | ({"medusa": medusa} if medusa else {})
    return DemoModels(model, tok, drafters, names, log=RunLog(log))


def main(argv=None) -> int:
    """``hf-spec demo`` / ``python demo/app.py``: load the models and serve the app on loopback."""
    import sys

    from .cli import demo_parser, quiet_bars_in_logs

    quiet_bars_in_logs()  # a demo's log (hf-spec demo > log 2>&1) gets no loading bars either

    args = demo_parser().parse_args(argv)
    medusa = args.medusa
    if medusa is None:
        from .medusa.heads import default_heads

        found = default_heads(args.target)  # None: no heads for this target, the Medusa choice is left out
        medusa = None if found is None else str(found)
    try:
        check_serving(args.host, args.port, args.log)  # before the models load (minutes), not after
        models = load_models(args.target, args.draft or None, medusa, args.dtype, args.device_map, args.log)
    except ValueError as e:  # bad input: one line and status 2, as the other commands
        print(f"hf-spec: error: {e}", file=sys.stderr)
        return 2
    except (OSError, ImportError) as e:  # a failure while running (a model that cannot be read): status 1
        print(f"hf-spec: error: {e}", file=sys.stderr)
        return 1
    app = build_app(models)
    app.launch(server_name=args.host, server_port=args.port, css=CSS, footer_links=[])
    return 0
