"""The benchmark harness: hf-spec's methods, plain decoding and transformers' own speculative decoding,
side by side on Spec-Bench prompts in one process.

Methods (``--methods``):

- ``baseline``: plain ``model.generate``;
- ``draft:NAME``: hf-spec with a draft model (``--draft-dtype``, bfloat16 by default);
- ``ngram``: hf-spec's n-gram prompt lookup (n <= 3);
- ``medusa:DIR``: hf-spec with the Medusa heads in folder DIR (``hf-spec train-medusa``; k <= heads);
- ``hf-assisted``: transformers' ``assistant_model=`` with the same draft model (a separate copy, same dtype),
  fixed k (``num_assistant_tokens=k``, constant schedule, confidence threshold 0);
- ``hf-prompt-lookup``: transformers' ``prompt_lookup_num_tokens=k`` with ``max_matching_ngram_size=3``.

Methods run interleaved prompt by prompt (and repeat by repeat) after a warm-up, so machine drift hits all
alike. Every method is timed the same way: wall time of the ``generate`` call, and a streamer's time stamps
for the first token (TTFT) and for each target forward's tokens. hf-spec's acceptance comes from its
statistics; transformers' from its candidate generators' draft lengths (recorded by wrapping
``get_candidates``, which changes nothing) and the streamer's per-forward token counts.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import torch
from transformers.generation import candidate_generator as hf_candidates
from transformers.generation.streamers import BaseStreamer

from .drafters.draft_model import DraftModelDrafter
from .drafters.medusa import MedusaDrafter
from .drafters.ngram import NgramDrafter
from .medusa.heads import MedusaHeads
from .loop import generate as spec_generate
from .metrics import SpecStats
from .prompts import Question, chat_inputs

__all__ = ["Method", "parse_methods", "run_bench", "write_report", "summarize", "markdown_table", "model_table", "model_check",
           "machine_config"]

KEYS = ("speedup_median", "speedup_total", "tokens_per_s", "ttft_s", "tpot_s", "total_s", "acceptance_rate",
        "mean_accepted_length", "acceptance_by_position", "identical_fraction")


@dataclass
class Method:
    """One benchmarked configuration.

    Attributes:
        name: the key in ``results.json`` (the ``--methods`` entry, with ``@k=K`` in a k sweep).
        kind: ``baseline``, ``draft``, ``ngram``, ``medusa``, ``hf-assisted`` or ``hf-prompt-lookup``.
        k: num_speculative_tokens: an int, "auto" or a controller such as :class:`~hf_spec.adaptive.CycleK`
            (hf-spec's methods only), or None for the baseline.
        draft: the draft model's short name (draft and hf-assisted), or the heads folder (medusa).
    """

    name: str
    kind: str
    k: int | None = None
    draft: str | None = None


def parse_methods(spec: str, ks: list[int], draft_name: str | None = None) -> list[Method]:
    """Parse ``--methods`` (comma-separated) for one k or a sweep of ks.

    Raises:
        ValueError: an unknown method, ``hf-assisted`` without a draft model, an empty list, k < 1.
    """
    names = [m.strip() for m in spec.split(",") if m.strip()]
    if not names:
        raise ValueError("--methods is empty; e.g. baseline,draft:qwen2.5-coder-0.5b,ngram,hf-assisted,hf-prompt-lookup")
    if any(k != "auto" and (not isinstance(k, int) or k < 1) for k in ks):
        raise ValueError(f"k must be an integer >= 1 or auto, got {ks}")
    drafts = [n.split(":", 1)[1] for n in names if n.startswith("draft:")]
    draft_name = draft_name or (drafts[0] if drafts else None)
    out = [Method("baseline", "baseline")]
    for n in names:
        if n == "baseline":
            continue
        if n.startswith("medusa:"):
            kind, draft = "medusa", n.split(":", 1)[1]
            if not draft:
                raise ValueError("medusa:DIR needs the heads folder, e.g. medusa:heads/qwen2.5-coder-1.5b")
        elif n.startswith("draft:"):
            kind, draft = "draft", n.split(":", 1)[1]
            if not draft:
                raise ValueError("draft:NAME needs a model name, e.g. draft:qwen2.5-coder-0.5b")
        elif n in ("ngram", "hf-prompt-lookup"):
            kind, draft = n, None
        elif n == "hf-assisted":
            if draft_name is None:
                raise ValueError("hf-assisted needs a draft model: add draft:NAME to --methods or pass --draft NAME")
            kind, draft = n, draft_name
        else:
            raise ValueError(f"unknown method {n!r}; use baseline, draft:NAME, medusa:DIR, ngram, hf-assisted, hf-prompt-lookup")
        if kind.startswith("hf-") and ks == ["auto"]:
            raise ValueError(f"{n} has no k=auto; compare at fixed k with e.g. --k-sweep 3,5,auto")
        for k in ks:
            if k == "auto" and kind.startswith("hf-"):
                continue  # transformers' peers run at the fixed ks only
            out.append(Method(n if len(ks) == 1 else f"{n}@k={k}", kind, k, draft))
    return out


class _Timer(BaseStreamer):
    """Time stamps of each ``put`` after the prompt's, and how many tokens each brought."""

    def __init__(self):
        self.prompt_seen = False
        self.times: list[float] = []
        self.chunks: list[int] = []

    def put(self, value):
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.times.append(time.perf_counter())
        self.chunks.append(int(value.numel()))

    def end(self):
        pass


@contextlib.contextmanager
def _count_hf_drafts(record: list[int]):
    """Record the number of tokens each transformers candidate generator drafts (observation only)."""
    classes = [hf_candidates.AssistedCandidateGenerator, hf_candidates.PromptLookupCandidateGenerator]
    originals = {c: c.__dict__["get_candidates"] for c in classes}

    def wrap(original):
        def get_candidates(self, input_ids, *args, **kwargs):
            out = original(self, input_ids, *args, **kwargs)
            record.append(int(out[0].shape[1] - input_ids.shape[1]))
            return out
        return get_candidates

    for c, f in originals.items():
        c.get_candidates = wrap(f)
    try:
        yield
    finally:
        for c, f in originals.items():
            c.get_candidates = f


def _hf_stats(chunks: list[int], drafted: list[int]) -> SpecStats:
    """Acceptance statistics of a transformers run: one chunk of tokens per target forward; the first
    forward of assisted generation already verifies a draft."""
    stats = SpecStats()
    for i, (emitted, nd) in enumerate(zip(chunks, drafted)):
        accepted = max(0, min(emitted - 1, nd))
        stats.num_row_steps += 1
        stats.num_emitted_tokens += emitted
        if nd:
            stats.num_drafts += 1
            stats.num_draft_tokens += nd
            stats.num_accepted_tokens += accepted
            stats._grow(nd)
            for j in range(nd):
                stats.drafted_per_position[j] += 1
            for j in range(accepted):
                stats.accepted_per_position[j] += 1
    return stats


def _run_once(model, method: Method, inputs, gen_kwargs, drafters, hf_draft, seed: int) -> dict:
    timer = _Timer()
    record: list[int] = []
    kwargs = dict(gen_kwargs)
    if method.kind == "baseline":
        kwargs["streamer"] = timer
    elif method.kind in ("draft", "ngram", "medusa"):
        kwargs.update(custom_generate=spec_generate, drafter=drafters[method.name], spec_streamer=timer,
                      num_speculative_tokens=method.k)
    elif method.kind == "hf-assisted":
        # transformers 5 reads these from the assistant's own generation config, not from generate's kwargs
        hf_draft.generation_config.update(num_assistant_tokens=method.k, num_assistant_tokens_schedule="constant",
                                          assistant_confidence_threshold=0.0)
        kwargs.update(assistant_model=hf_draft, streamer=timer)
    elif method.kind == "hf-prompt-lookup":
        kwargs.update(prompt_lookup_num_tokens=method.k, max_matching_ngram_size=3, streamer=timer)
    torch.manual_seed(seed)
    with _count_hf_drafts(record):
        t0 = time.perf_counter()
        out = model.generate(**inputs, **kwargs)
        total = time.perf_counter() - t0
    sequences = out.sequences if hasattr(out, "sequences") else out
    tokens = sequences[0, inputs["input_ids"].shape[1]:].tolist()
    n = len(tokens)
    ttft = timer.times[0] - t0 if timer.times else total
    row = {"new_tokens": n, "total_s": total, "ttft_s": ttft, "tpot_s": (total - ttft) / (n - 1) if n > 1 else 0.0,
           "tokens_per_s": n / total, "tokens": tokens}
    if method.kind in ("draft", "ngram", "medusa"):
        row["stats"] = out.stats
    elif method.kind.startswith("hf-"):
        row["stats"] = _hf_stats(timer.chunks, record)
    return row


def _load_draft(name: str, dtype, device=None):
    """A draft model by name, in ``dtype``, on ``device`` (the target's; CPU when ``None``)."""
    from .models import load

    model, _ = load(name, dtype=dtype)
    if device is not None and torch.device(device).type not in ("cpu", "meta"):
        model.to(device)
    return model


def run_bench(
    target,
    tokenizer,
    methods: list[Method],
    questions: list[Question],
    *,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    repeats: int = 1,
    draft_dtype=torch.bfloat16,
    seed: int = 0,
    progress: bool = True,
    journal: str | Path | None = None,
) -> dict:
    """Run every method on every question, interleaved, and return per-prompt measurements.

    Args:
        target: the target model.
        tokenizer: its tokenizer.
        methods: from :func:`parse_methods` (``baseline`` first).
        questions: prompts (turn 1 goes through the chat template).
        max_new_tokens: new tokens per prompt.
        temperature: 0 = greedy; > 0 samples.
        repeats: runs per prompt and method; the median run (by total time) is kept.
        draft_dtype: dtype of draft models (loaded on the target's device).
        journal: a file where each finished prompt's measurements are saved (atomically) as the run goes;
            a run with the same settings and journal skips the prompts already there (resume after an
            interruption). Machine drift between the sessions hits every method alike, since methods are
            interleaved within each prompt.

    Returns:
        ``{"prompts": [{"question_id", "category", "prompt_tokens", "runs": {METHOD: measurement}}]}``.

    Raises:
        ValueError: no questions, or repeats < 1, or a journal written with other settings.
    """
    from tqdm import tqdm

    method_keys = [(m.name, m.kind, m.k if isinstance(m.k, (int, str, type(None))) else type(m.k).__name__, m.draft)
                   for m in methods]
    key = json.dumps({"target": getattr(target, "name_or_path", ""), "methods": method_keys,
                      "questions": [q.question_id for q in questions], "max_new_tokens": max_new_tokens,
                      "temperature": temperature, "repeats": repeats, "draft_dtype": str(draft_dtype),
                      "dtype": str(target.dtype), "seed": seed})
    done: dict[str, dict] = {}
    journal = Path(journal) if journal is not None else None
    if journal is not None and journal.exists():
        with open(journal, "rb") as f:
            state = pickle.load(f)
        if state.get("key") != key:
            raise ValueError(f"{journal} holds a partial run with other settings; use another --out or delete it")
        done = {p["question_id"]: p for p in state["prompts"]}

    if not questions:
        raise ValueError("no questions selected: check --categories / --questions")
    if repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {repeats}")
    draft_models = {m.draft: None for m in methods if m.kind == "draft"}
    for name in draft_models:
        draft_models[name] = _load_draft(name, draft_dtype, target.device)
    hf_draft = None
    hf_names = {m.draft for m in methods if m.kind == "hf-assisted"}
    if hf_names:  # a separate copy: hf-spec's drafter patches its draft's prefill (see kernels.py)
        hf_draft = _load_draft(hf_names.pop(), draft_dtype, target.device)
    drafters, medusa = {}, {}
    for m in methods:
        k = m.k if isinstance(m.k, int) else 3  # "auto" or a controller sets k per step (auto measures 3 after k=1)
        if m.kind == "draft":
            drafters[m.name] = DraftModelDrafter(draft_models[m.draft], k)
        elif m.kind == "ngram":
            drafters[m.name] = NgramDrafter(k)
        elif m.kind == "medusa":
            if m.draft not in medusa:
                medusa[m.draft] = MedusaDrafter(MedusaHeads.from_pretrained(m.draft, target=target),
                                                m.k if isinstance(m.k, int) else None)
            drafters[m.name] = medusa[m.draft]  # one drafter (one lm_head hook) per folder; k set per run
    gen_kwargs = dict(max_new_tokens=max_new_tokens, do_sample=temperature > 0)
    gen_kwargs.update(dict(temperature=temperature) if temperature > 0 else dict(temperature=None, top_p=None, top_k=None))

    warm = chat_inputs(tokenizer, "Write one sentence about the sea.")
    for m in methods:  # one-time costs (allocations, kernels) land on nobody's measurement
        _run_once(target, m, warm, dict(gen_kwargs, max_new_tokens=8), drafters, hf_draft, seed)

    prompts = []
    bar = tqdm(total=len(questions) * len(methods) * repeats, desc="bench", disable=not progress)
    for qi, q in enumerate(questions):
        if q.question_id in done:
            prompts.append(done[q.question_id])
            bar.update(len(methods) * repeats)
            continue
        inputs = chat_inputs(tokenizer, q.text)
        runs: dict[str, list] = {m.name: [] for m in methods}
        for _ in range(repeats):
            for m in methods:
                runs[m.name].append(_run_once(target, m, inputs, gen_kwargs, drafters, hf_draft, seed + qi))
                bar.update()
        kept = {name: sorted(rs, key=lambda r: r["total_s"])[len(rs) // 2] for name, rs in runs.items()}
        prompts.append({"question_id": q.question_id, "category": q.category,
                        "prompt_tokens": int(inputs["input_ids"].shape[1]), "runs": kept})
        if journal is not None:
            journal.parent.mkdir(parents=True, exist_ok=True)
            tmp = journal.with_name(journal.name + ".tmp")
            with open(tmp, "wb") as f:
                pickle.dump({"key": key, "prompts": prompts}, f)
            os.replace(tmp, journal)
    bar.close()
    return {"prompts": prompts}


def _aggregate(prompts: list[dict], name: str, greedy: bool) -> dict:
    base = [p["runs"]["baseline"] for p in prompts]
    mine = [p["runs"][name] for p in prompts]
    ratios = [m["tokens_per_s"] / b["tokens_per_s"] for m, b in zip(mine, base)]
    tok, sec = sum(m["new_tokens"] for m in mine), sum(m["total_s"] for m in mine)
    btok, bsec = sum(b["new_tokens"] for b in base), sum(b["total_s"] for b in base)
    out = {
        "speedup_median": statistics.median(ratios),
        "speedup_total": (tok / sec) / (btok / bsec),
        "tokens_per_s": tok / sec,
        "ttft_s": statistics.median(m["ttft_s"] for m in mine),
        "tpot_s": statistics.median(m["tpot_s"] for m in mine),
        "total_s": sec,
        "acceptance_rate": None,
        "mean_accepted_length": None,
        "acceptance_by_position": [],
        "identical_fraction": (sum(_identical(m, b) for m, b in zip(mine, base)) / len(mine) if greedy else None),
    }
    stats = [m["stats"] for m in mine if "stats" in m]
    if stats:
        total = SpecStats()
        for s in stats:
            total.merge(s)
        out.update(acceptance_rate=total.acceptance_rate, mean_accepted_length=_tokens_per_forward(total),
                   acceptance_by_position=total.acceptance_by_position)
        if total.policy_events:  # k=auto: what the controller did
            out.update(k_mean=statistics.fmean(total.k_per_step) if total.k_per_step else None,
                       speculation_off_fraction=total.k_per_step.count(0) / max(1, len(total.k_per_step)))
    return out


def decode_time_per_token(runs: list[dict]) -> float:
    """Seconds per output token after the first (TPOT), over several runs' totals (prefill excluded)."""
    return sum(r["total_s"] - r["ttft_s"] for r in runs) / max(1, sum(r["new_tokens"] - 1 for r in runs))


def _identical(run: dict, base: dict) -> bool:
    """Whether a run's tokens equal the baseline's (from the tokens, or from a results.json's flag)."""
    if "tokens" in run and "tokens" in base:
        return run["tokens"] == base["tokens"]
    return bool(run["identical"])


def _tokens_per_forward(stats: SpecStats) -> float:
    """Tokens per verifying forward, bonus included (hf-spec: prefill excluded; transformers' first forward
    already verifies a draft, so all of its forwards count)."""
    return stats.mean_accepted_length if stats.num_sequences else (
        stats.num_emitted_tokens / stats.num_row_steps if stats.num_row_steps else 0.0)


def model_check(prompts: list[dict], name: str, k: int) -> dict | None:
    """The speedup model against the measurement, with every input measured in this run.

    T_1 is the baseline's decode time per token (TPOT, from its totals over ``prompts``); from the hf-spec
    method's own step events: the conditional acceptance by position, c = draft seconds per drafted position
    over T_1, and the verify cost = seconds per verify forward (k + 1 positions, acceptance included) over
    T_1. The prediction is :func:`~hf_spec.tuning.expected_speedup` of those; the measurement is the TPOT
    ratio (decode phase, prefill excluded).

    Returns:
        ``{"predicted", "measured", "error", "cost_ratio", "verify_cost", "conditional_acceptance"}``, or
        ``None`` for a method without hf-spec step statistics (baseline, transformers' own) or without
        decode steps.
    """
    from .tuning import conditional_acceptance, expected_speedup

    runs = [p["runs"][name] for p in prompts]
    if not runs or any("stats" not in r or not hasattr(r["stats"], "draft_time_s") for r in runs) or not k:
        return None
    base = [p["runs"]["baseline"] for p in prompts]
    t1 = decode_time_per_token(base)
    total = SpecStats()
    for r in runs:
        total.merge(r["stats"])
    steps = total.num_row_steps - total.num_sequences  # decode forwards (batch size 1)
    if steps <= 0 or t1 <= 0:
        return None
    # the prefill's event time is its verify time (step 0 drafts nothing): take it out of verify time
    verify = (total.verify_time_s - total.ttft_s) / steps / t1
    c = total.draft_time_s / (steps * k) / t1
    acceptance = conditional_acceptance(total) or [0.0]
    predicted = expected_speedup(acceptance, k, c, lambda n: verify)
    measured = t1 / decode_time_per_token(runs)
    return {"predicted": predicted, "measured": measured, "error": predicted / measured - 1, "cost_ratio": c,
            "verify_cost": verify, "conditional_acceptance": acceptance}


def summarize(raw: dict, methods: list[Method], greedy: bool) -> dict:
    """Per method, overall and per category: the ``KEYS`` values (baseline included, speedup 1.0), and for
    hf-spec's methods at a fixed k the speedup model's check (:func:`model_check`) under ``"model"``."""
    prompts = raw["prompts"]
    cats = list(dict.fromkeys(p["category"] for p in prompts))
    out = {}
    for m in methods:
        entry = _aggregate(prompts, m.name, greedy)
        entry["k"] = m.k
        if m.kind in ("draft", "ngram", "medusa") and isinstance(m.k, int):
            entry["model"] = model_check(prompts, m.name, m.k)
        entry["per_category"] = {c: _aggregate([p for p in prompts if p["category"] == c], m.name, greedy) for c in cats}
        out[m.name] = entry
    return out


def speedup_vs_k(summary: dict, methods: list[Method]) -> dict:
    """Per method family (``draft:NAME``, ``ngram``...), one point per fixed k: the measured decode-phase
    speedup (baseline TPOT over the method's) beside the speedup model's prediction from the run's own
    acceptance, cost ratio and verify cost (:func:`model_check`; ``None`` for transformers' methods)."""
    out: dict[str, list] = {}
    for m in methods:
        if m.kind == "baseline" or not isinstance(m.k, int):  # k=auto has no single k to put on the axis
            continue
        check = summary[m.name].get("model")
        point = {"k": m.k, "measured": summary["baseline"]["tpot_s"] / summary[m.name]["tpot_s"],
                 "measured_total": summary[m.name]["speedup_total"], "predicted": None}
        if check:
            point.update(predicted=check["predicted"], cost_ratio=check["cost_ratio"], verify_cost=check["verify_cost"])
        out.setdefault(m.name.split("@", 1)[0], []).append(point)
    return out


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def markdown_table(summary: dict) -> str:
    """One row per method: ``| method | TTFT | TPOT | total | tokens/s | speedup | acceptance | mean accepted | identical |``."""
    lines = ["| method | TTFT | TPOT | total | tokens/s | speedup | acceptance | mean accepted | identical |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, m in summary.items():
        lines.append(
            f"| {name} | {m['ttft_s']:.2f} s | {m['tpot_s'] * 1000:.0f} ms | {m['total_s']:.1f} s | "
            f"{m['tokens_per_s']:.2f} | {m['speedup_median']:.2f}x (total {m['speedup_total']:.2f}x) | "
            f"{_fmt(m['acceptance_rate'], '.1%')} | {_fmt(m['mean_accepted_length'], '.2f')} | "
            f"{_fmt(m['identical_fraction'], '.0%')} |")
    return "\n".join(lines)


def model_table(summary: dict) -> str:
    """The speedup model's check per hf-spec method: inputs measured in the run, prediction, measurement."""
    lines = ["| method | conditional acceptance by position | c | T_verify(k+1)/T_1 | predicted | measured (TPOT ratio) | error |",
             "|---|---|---|---|---|---|---|"]
    for name, m in summary.items():
        chk = m.get("model")
        if chk:
            lines.append(f"| {name} | {' '.join(f'{a:.2f}' for a in chk['conditional_acceptance'])} | {chk['cost_ratio']:.3f} | "
                         f"{chk['verify_cost']:.2f} | {chk['predicted']:.2f}x | {chk['measured']:.2f}x | {chk['error']:+.1%} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def _plots(summary: dict, out: Path, prediction: dict | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def save(fig, ax, name: str) -> None:
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)

    names = [n for n in summary if n != "baseline"]
    cats = list(next(iter(summary.values()))["per_category"])
    fig, ax = plt.subplots(figsize=(max(6, len(cats) * 0.9), 4))
    width = 0.8 / max(1, len(names))
    for i, n in enumerate(names):
        vals = [summary[n]["per_category"][c]["speedup_median"] for c in cats]
        ax.bar([j + i * width for j in range(len(cats))], vals, width, label=n)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cats))], cats, rotation=45, ha="right")
    ax.set_ylabel("speedup over plain decoding (median)")
    save(fig, ax, "speedup_by_category.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    for n in names:
        acc = summary[n]["acceptance_by_position"]
        if acc:
            ax.plot(range(1, len(acc) + 1), acc, marker="o", label=n)
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance")
    ax.set_ylim(0, 1.05)
    save(fig, ax, "acceptance_by_position.png")

    if prediction:
        fig, ax = plt.subplots(figsize=(6, 4))
        for family, pts in prediction.items():
            ks = [p["k"] for p in pts]
            line = ax.plot(ks, [p["measured"] for p in pts], marker="o", label=f"{family} measured")[0]
            if all(p.get("predicted") is not None for p in pts):
                ax.plot(ks, [p["predicted"] for p in pts], ls="--", color=line.get_color(), label=f"{family} predicted")
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xlabel("k (num_speculative_tokens)")
        ax.set_ylabel("speedup (decode phase, TPOT ratio)")
        save(fig, ax, "speedup_vs_k.png")


def write_report(out_dir: str | Path, config: dict, summary: dict, raw: dict, prediction: dict | None = None) -> Path:
    """Write ``results.json``, ``results.md`` and the PNG plots into ``out_dir`` (all or nothing: files are
    written to a temporary folder beside it and moved in at the end)."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".bench-", dir=out_dir.parent))
    try:
        per_prompt = [{k: v for k, v in p.items() if k != "runs"} | {
            "runs": {n: {k: v for k, v in r.items() if k not in ("tokens", "stats")}
                     | {"identical": _identical(r, p["runs"]["baseline"])}
                     | ({"stats": {k: v for k, v in r["stats"].to_dict().items() if k != "per_row"}} if "stats" in r else {})
                     for n, r in p["runs"].items()}}
            for p in raw["prompts"]]
        result = {"config": config, "methods": summary, "prompts": per_prompt}
        if prediction:
            result["speedup_vs_k"] = prediction
        (tmp / "results.json").write_text(json.dumps(result, indent=2))
        md = [f"# hf-spec bench: {config['target']}", "",
              f"{config['date']}, commit {config['commit']}, {config['machine']}, {config['threads']} threads; "
              f"{config['num_prompts']} prompts, {config['max_new_tokens']} new tokens, "
              f"temperature {config['temperature']}, dtype {config['dtype']}, draft dtype {config['draft_dtype']}.",
              "", markdown_table(summary), ""]
        if model_table(summary):
            md += ["The speedup model, every input measured in this run (decode phase; see `hf_spec.bench.model_check`):",
                   "", model_table(summary), ""]
        (tmp / "results.md").write_text("\n".join(md))
        _plots(summary, tmp, prediction)
        out_dir.mkdir(exist_ok=True)
        for f in tmp.iterdir():
            f.replace(out_dir / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def load_results(path: str | Path) -> tuple[dict, dict, list[Method]]:
    """Read a ``results.json`` back into ``(config, raw, methods)`` for :func:`summarize` and
    :func:`write_report` (e.g. to combine runs: ``scripts/combine_bench.py``).

    Per-prompt statistics become :class:`~hf_spec.metrics.SpecStats` again; token ids are not stored, so each
    run carries its ``identical`` flag (files written before the flag existed: taken from the method's
    ``identical_fraction`` when that is 0 or 1).

    Raises:
        ValueError: a file without per-prompt data, or whose identity per prompt cannot be told.
    """
    from dataclasses import fields

    result = json.loads(Path(path).read_text())
    if "prompts" not in result:
        raise ValueError(f"{path} has no per-prompt data (written by an older hf-spec)")
    config = result["config"]
    methods = parse_methods(config["methods"], config["ks"])
    names = {f.name for f in fields(SpecStats)} - {"per_row"}
    for p in result["prompts"]:
        for name, run in p["runs"].items():
            if "stats" in run:
                run["stats"] = SpecStats(**{k: v for k, v in run["stats"].items() if k in names})
            if "identical" not in run:
                fraction = result["methods"][name]["identical_fraction"]
                if fraction not in (0.0, 1.0):
                    raise ValueError(f"{path}: cannot tell which prompts of {name} were identical ({fraction:.0%})")
                run["identical"] = fraction == 1.0
    return config, {"prompts": result["prompts"]}, methods


def machine_config() -> dict:
    """Date, commit, CPU and library versions for a report."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent).stdout.strip() or "?"
    except OSError:
        commit = "?"
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import transformers

    return {"date": str(date.today()), "commit": commit, "machine": cpu, "threads": torch.get_num_threads(),
            "torch": torch.__version__, "transformers": transformers.__version__}
