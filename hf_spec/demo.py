"""The Gradio demo: speculative decoding shown token by token, live.

``hf-spec demo`` (or ``python demo/app.py``) serves it on a loopback port. Each step of the loop arrives as a
:class:`~hf_spec.events.StepEvent` (the same events that feed the statistics and the benchmark) and is drawn
at once: the drafter's accepted tokens, its rejected tokens struck through, and the target's own token (the
correction that replaces them, or the bonus token after a fully accepted draft), each in its own colour.
Beside it: acceptance rate, mean accepted length, tokens/s, acceptance by position, the k of each step, and
optionally plain decoding of the same prompt with its own timer.

Requests are queued one at a time (``default_concurrency_limit=1``): the models and drafters are shared, so
two users' generations never interleave, and each user's page gets only its own stream.
"""

from __future__ import annotations

import html
import queue
import threading
import time
from dataclasses import dataclass, field

import torch
from transformers import StoppingCriteria, StoppingCriteriaList, TextIteratorStreamer

from .events import StepEvent
from .metrics import SpecStats

__all__ = ["render_tokens", "build_app", "main", "DemoModels"]

MAX_NEW_TOKENS = 1024
K_CHOICES = ["auto"] + [str(k) for k in range(1, 13)]
METHODS = ["draft model", "medusa", "n-gram", "none"]

CSS = """
.hfspec-out {font-family: ui-monospace, monospace; white-space: pre-wrap; line-height: 1.6; font-size: 14px;}
.hfspec-acc {background: #c8f7c5; color: #0b4d07;}
.hfspec-rej {background: #ffd0d0; color: #8a0000; text-decoration: line-through;}
.hfspec-fix {background: #cfe0ff; color: #0a2f7a;}
.hfspec-bonus {background: #ead1ff; color: #4b0a7a;}
.hfspec-legend span {padding: 1px 6px; margin-right: 8px; border-radius: 3px;}
"""

LEGEND = ('<div class="hfspec-legend"><span class="hfspec-acc">accepted draft token</span>'
          '<span class="hfspec-rej">rejected draft token</span>'
          '<span class="hfspec-fix">target token (prefill or correction)</span>'
          '<span class="hfspec-bonus">bonus token (whole draft accepted)</span></div>')


def _span(kind: str, text: str) -> str:
    return f'<span class="hfspec-{kind}">{html.escape(text)}</span>'


def render_tokens(events: list[StepEvent], decode) -> str:
    """HTML of one sequence's steps (batch size 1): per step the accepted drafted tokens, the rejected ones
    struck through, then the target's token (correction or bonus). ``decode`` maps a token id to its text."""
    parts = []
    for ev in events:
        drafted, accepted, emitted = ev.drafted[0], ev.num_accepted[0], ev.emitted[0]
        for tok in emitted[:accepted]:
            parts.append(_span("acc", decode(tok)))
        if len(emitted) > accepted:
            for tok in drafted[accepted:]:
                parts.append(_span("rej", decode(tok)))
            kind = "bonus" if drafted and accepted == len(drafted) else "fix"
            parts.append(_span(kind, decode(emitted[accepted])))
    return '<div class="hfspec-out">' + "".join(parts) + "</div>"


def _stats_markdown(stats: SpecStats, elapsed: float, plain: dict | None = None, status: str = "generating") -> str:
    tps = stats.num_emitted_tokens / elapsed if elapsed > 0 else 0.0
    lines = ["| measure | value |", "|---|---|", f"| status | {status} |",
             f"| new tokens | {stats.num_emitted_tokens} |",
             f"| acceptance rate | {stats.acceptance_rate:.1%} |",
             f"| mean accepted length | {stats.mean_accepted_length:.2f} |",
             f"| target forwards | {stats.num_target_forwards} |",
             f"| tokens/s | {tps:.2f} |",
             f"| TTFT | {stats.ttft_s:.2f} s |"]
    if stats.k_per_step:
        off = stats.k_per_step.count(0)
        lines.append(f"| k per step (last 10) | {' '.join(map(str, stats.k_per_step[-10:]))}"
                     f"{f' ({off} steps without speculation)' if off else ''} |")
    if plain:
        lines.append(f"| plain decoding | {plain['tokens']} tokens, {plain['tokens_per_s']:.2f} tok/s |")
        if plain.get("done") and plain["tokens_per_s"] > 0:
            lines.append(f"| **speedup** | **{tps / plain['tokens_per_s']:.2f}x** |")
    return "\n".join(lines)


def _acceptance_plot(stats: SpecStats):
    """A small matplotlib bar chart of acceptance by draft position."""
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
    fig.tight_layout()
    plt.close(fig)
    return fig


class _StopFlag(StoppingCriteria):
    """Ends generation when the user presses Stop."""

    def __init__(self, flag: threading.Event):
        self.flag = flag

    def __call__(self, input_ids, scores, **kwargs):
        return torch.full((input_ids.shape[0],), self.flag.is_set(), dtype=torch.bool, device=input_ids.device)


@dataclass
class DemoModels:
    """What the demo serves: the target, its tokenizer, and its drafters by the label the page shows.

    The drafters are built once (:func:`load_models`, through the drafter registry) and shared by every
    request: a generate call works on its own bound copy of a drafter and passes k per call, so requests never
    change one another's drafter.
    """

    target: object
    tokenizer: object
    drafters: dict = field(default_factory=dict)  # label in METHODS -> Drafter
    names: dict = field(default_factory=dict)

    def drafter(self, method: str):
        """The drafter for a page label (``None`` for ``"none"``).

        Raises:
            ValueError: an unknown label, or one whose model was not loaded.
        """
        if method == "none":
            return None
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
        if method not in self.drafters:
            flag = {"draft model": "--draft NAME", "medusa": "--medusa DIR|NAME"}.get(method, "")
            raise ValueError(f"no {method} drafter loaded: start the demo with {flag}")
        return self.drafters[method]


def _check(prompt: str, k, max_new_tokens, temperature, top_p) -> tuple:
    """Validate the form; raise ValueError with a message for the page."""
    if not prompt or not prompt.strip():
        raise ValueError("Empty prompt: type a question or some code first.")
    if str(k) not in K_CHOICES:
        raise ValueError(f"k must be auto or an integer from 1 to 12, got {k!r}.")
    k = "auto" if str(k) == "auto" else int(k)
    try:
        max_new_tokens = int(max_new_tokens)
    except (TypeError, ValueError):
        raise ValueError(f"Max new tokens must be a whole number, got {max_new_tokens!r}.")
    if not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise ValueError(f"Max new tokens must be between 1 and {MAX_NEW_TOKENS}, got {max_new_tokens}.")
    temperature, top_p = float(temperature or 0.0), float(top_p or 1.0)
    if not 0 <= temperature <= 2:
        raise ValueError(f"Temperature must be between 0 (greedy) and 2, got {temperature}.")
    if not 0 < top_p <= 1:
        raise ValueError(f"Top-p must be in (0, 1], got {top_p}.")
    return k, max_new_tokens, temperature, top_p


def stream(models: DemoModels, prompt: str, method: str, k, temperature: float, top_p: float, max_new_tokens: int,
           compare: bool, stop: threading.Event):
    """Run one generation and yield ``(tokens_html, stats_markdown, acceptance_plot, plain_text)`` as the
    steps arrive. Raises ValueError for bad input (before any model runs)."""
    from .loop import generate as spec_generate
    from .prompts import chat_inputs

    from .loop import plan_num_speculative_tokens

    k, max_new_tokens, temperature, top_p = _check(prompt, k, max_new_tokens, temperature, top_p)
    drafter = models.drafter(method)
    plan_num_speculative_tokens(k, drafter)  # k above what the drafter can propose: a message before any work
    tok = models.tokenizer
    inputs = chat_inputs(tok, prompt)
    sampling = dict(do_sample=True, temperature=temperature, top_p=top_p) if temperature > 0 else \
        dict(do_sample=False, temperature=None, top_p=None, top_k=None)
    stop.clear()
    stopping = StoppingCriteriaList([_StopFlag(stop)])
    events: queue.Queue = queue.Queue()
    result: dict = {}

    def run():
        try:
            result["out"] = models.target.generate(
                **inputs, max_new_tokens=max_new_tokens, custom_generate=spec_generate, return_dict_in_generate=True, drafter=drafter,
                num_speculative_tokens=k if drafter is not None else None, event_listeners=[events.put],
                stopping_criteria=stopping, tokenizer=tok, **sampling)
        except Exception as e:  # shown in the page
            result["error"] = e
        finally:
            events.put(None)

    decode = lambda t: tok.decode([t])  # noqa: E731
    seen: list[StepEvent] = []
    stats = SpecStats()
    t0 = time.perf_counter()
    threading.Thread(target=run, daemon=True).start()
    last = last_plot = 0.0
    plot = _acceptance_plot(stats)
    while True:
        ev = events.get()
        if ev is not None:
            seen.append(ev)
            stats(ev)
        now = time.perf_counter()
        if ev is None or now - last > 0.05:
            last = now
            if ev is None or now - last_plot > 1.0:  # the plot costs more to draw: once a second
                last_plot, plot = now, _acceptance_plot(stats)
            yield (LEGEND + render_tokens(seen, decode), _stats_markdown(stats, now - t0),
                   plot, "")
        if ev is None:
            break
    if "error" in result:
        raise ValueError(f"Generation failed: {result['error']}")
    elapsed = stats.total_s or (time.perf_counter() - t0)
    html_out = LEGEND + render_tokens(seen, decode)
    if not compare or stop.is_set():
        yield (html_out, _stats_markdown(stats, elapsed, status="stopped" if stop.is_set() else "finished"),
               plot, "")
        return
    # plain decoding of the same prompt, streamed with its own timer
    streamer = TextIteratorStreamer(tok, skip_prompt=True, skip_special_tokens=True)
    plain: dict = {"tokens": 0, "tokens_per_s": 0.0}
    box: dict = {}

    def run_plain():
        torch.manual_seed(0)
        box["out"] = models.target.generate(**inputs, max_new_tokens=max_new_tokens, streamer=streamer,
                                            stopping_criteria=StoppingCriteriaList([_StopFlag(stop)]),
                                            tokenizer=tok, **sampling)

    t1 = time.perf_counter()
    threading.Thread(target=run_plain, daemon=True).start()
    text = ""
    for piece in streamer:
        text += piece
        plain["tokens"] += 1  # approximate while streaming; exact count below
        plain["tokens_per_s"] = plain["tokens"] / (time.perf_counter() - t1)
        yield html_out, _stats_markdown(stats, elapsed, plain, "plain decoding"), plot, text
    total = time.perf_counter() - t1
    if "out" in box:
        from .loop import generated_length

        row = box["out"][0, inputs["input_ids"].shape[1]:].tolist()
        plain["tokens"] = generated_length(row, models.target.generation_config.eos_token_id)
    plain.update(tokens_per_s=plain["tokens"] / total, done=True)
    yield html_out, _stats_markdown(stats, elapsed, plain, "finished"), plot, text


def build_app(models: DemoModels):
    """The Gradio Blocks app (not launched)."""
    import gradio as gr

    methods = [m for m in METHODS if m == "none" or m in models.drafters]
    with gr.Blocks(title="hf-spec: speculative decoding, live", analytics_enabled=False) as app:
        gr.Markdown(f"## hf-spec: speculative decoding, live\nTarget **{models.names.get('target', '?')}**"
                    + (f", draft **{models.names['draft']}**" if models.names.get("draft") else "")
                    + (f", Medusa heads **{models.names['medusa']}**" if models.names.get("medusa") else "")
                    + ". Greedy output is token-identical to the target's own `generate`; sampling keeps its "
                      "distribution.")
        stop_flag = gr.State(threading.Event)
        with gr.Row():
            with gr.Column(scale=1):
                prompt = gr.Textbox(label="Prompt", lines=4, elem_id="prompt",
                                    value="Write a Python function that checks whether a number is prime.")
                method = gr.Radio(methods, value=methods[0], label="Drafter", elem_id="method")
                k = gr.Dropdown(K_CHOICES, value="auto", label="k (num_speculative_tokens)", elem_id="k")
                temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature (0 = greedy)")
                top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="Top-p")
                max_new = gr.Number(value=128, precision=0, label=f"Max new tokens (1-{MAX_NEW_TOKENS})",
                                    elem_id="max_new")
                compare = gr.Checkbox(value=False, label="Then run plain decoding of the same prompt (speedup)")
                with gr.Row():
                    go = gr.Button("Generate", variant="primary", elem_id="generate")
                    halt = gr.Button("Stop", elem_id="stop")
                error = gr.Markdown(elem_id="error")
            with gr.Column(scale=2):
                out = gr.HTML(LEGEND, elem_id="tokens")
                stats = gr.Markdown(elem_id="stats")
                plot = gr.Plot(label="Acceptance by draft position", elem_id="acceptance_plot")
                plain = gr.Textbox(label="Plain decoding (when asked)", lines=4, elem_id="plain")

        def on_generate(prompt, method, k, temperature, top_p, max_new, compare, flag):
            try:
                for html_out, md, frame, text in stream(models, prompt, method, k, temperature, top_p, max_new,
                                                        compare, flag):
                    yield html_out, md, frame, text, ""
            except ValueError as e:
                yield gr.update(), gr.update(), gr.update(), gr.update(), f"**Error:** {html.escape(str(e))}"

        go.click(on_generate, [prompt, method, k, temperature, top_p, max_new, compare, stop_flag],
                      [out, stats, plot, plain, error])
        halt.click(lambda flag: flag.set(), [stop_flag], None, queue=False)
    app.queue(default_concurrency_limit=1)
    return app


def load_models(target: str, draft: str | None, medusa: str | None, dtype: str = "auto",
                device_map: str | None = None) -> DemoModels:
    """Load the target by short name, folder or hub name, and build its drafters with the drafter registry:
    n-gram lookup always, ``draft:DRAFT`` and ``medusa:MEDUSA`` when named.

    Args:
        device_map: ``--device-map`` (:func:`hf_spec.device.resolve_device_map`; default: ``auto`` when CUDA is
            available, else ``cpu``); ``dtype="auto"`` decides for that device. Drafts go on the target's device.

    Raises:
        ValueError: a bad drafter spec (e.g. no such Medusa heads) or device map, before the target loads.
    """
    from .device import resolve_device_map, resolve_dtype
    from .drafters.registry import make_drafter, parse_drafter
    from .models import load

    device_map = resolve_device_map(device_map)
    specs = {"draft model": f"draft:{draft}" if draft else None, "medusa": f"medusa:{medusa}" if medusa else None,
             "n-gram": "ngram"}
    parsed = {label: parse_drafter(spec) for label, spec in specs.items() if spec}  # fail before loading
    model, tok = load(target, dtype=resolve_dtype(dtype, device_map), device_map=device_map)
    drafters = {label: make_drafter(spec, target=model, tokenizer=tok) for label, spec in parsed.items()}
    names = {"target": target} | ({"draft": draft} if draft else {}) | ({"medusa": medusa} if medusa else {})
    return DemoModels(model, tok, drafters, names)


def main(argv=None) -> int:
    """``hf-spec demo`` / ``python demo/app.py``: load the models and serve the app on loopback."""
    import argparse
    import sys

    from .device import DEVICE_MAP_HELP

    p = argparse.ArgumentParser(prog="hf-spec demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="qwen2.5-coder-1.5b")
    p.add_argument("--draft", default="qwen2.5-coder-0.5b", help="draft model ('' for none)")
    p.add_argument("--medusa", default=None,
                   help="Medusa heads folder or name (default: the target's, when trained or shipped)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="compute dtype; auto = the fastest that is sound on the device the target goes to")
    p.add_argument("--device-map", default=None, metavar="MAP", help=DEVICE_MAP_HELP)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=7860)
    args = p.parse_args(argv)
    medusa = args.medusa
    if medusa is None:
        from .medusa.heads import MedusaCheckpointError, heads_path

        try:
            heads_path(args.target)
            medusa = args.target
        except MedusaCheckpointError:
            medusa = None  # no heads for this target: the Medusa choice is left out
    try:
        models = load_models(args.target, args.draft or None, medusa, args.dtype, args.device_map)
    except ValueError as e:  # bad input: one line, as the other commands
        print(f"hf-spec: error: {e}", file=sys.stderr)
        return 2
    app = build_app(models)
    app.launch(server_name=args.host, server_port=args.port, css=CSS, footer_links=[])
    return 0
