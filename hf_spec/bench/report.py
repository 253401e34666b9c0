"""Reporting the benchmark: aggregation per method and category, the speedup model's check, markdown tables,
``results.json`` (written all or nothing, and read back to combine runs) and the plots (:mod:`.plots`)."""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
from pathlib import Path

from ..metrics import SpecStats
from ..prompts import counted
from .runner import Method, parse_methods

__all__ = ["KEYS", "summarize", "model_check", "speedup_vs_k", "markdown_table", "model_table", "differences_table", "write_report",
           "load_results", "decode_time_per_token", "speedup_warning", "contention_warning", "timing_warnings", "tune_warnings",
           "MIN_VERIFY_COST", "TPOT_DRIFT", "PREDICTION_SPREAD"]

KEYS = ("speedup_median", "speedup_total", "tokens_per_s", "ttft_s", "tpot_s", "total_s", "acceptance_rate",
        "mean_accepted_length", "acceptance_by_position", "identical_fraction")


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
    timed = [m for m in mine if "other_cpu_s" in m]  # what else ran on the CPU meanwhile (OtherCpu); runs from
    if timed:  # before it was measured (an older results.json combined, an older journal resumed) are left out
        wall = sum(m["total_s"] for m in timed)
        out.update(other_cpu_cores=sum(m["other_cpu_s"] for m in timed) / wall if wall > 0 else 0.0,
                   steal_cores=sum(m["steal_s"] for m in timed) / wall if wall > 0 else 0.0)
    stats = [m["stats"] for m in mine if "stats" in m]
    if stats:
        total = SpecStats()
        for s in stats:
            total.merge(s)
        out.update(acceptance_rate=total.acceptance_rate, mean_accepted_length=_tokens_per_forward(total),
                   acceptance_by_position=total.acceptance_by_position)
        if any(total.positions_per_step):  # positions verified per step (a tree's nodes + 1): what --tree auto chose
            out["verify_positions_mean"] = statistics.fmean(total.positions_per_step)
        if total.per_source:  # the hybrid drafter: drafted and accepted tokens by source
            out["per_source"] = total.per_source
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
    from ..tuning import conditional_acceptance, expected_speedup

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
    hf-spec's methods at a fixed k drafting chains the speedup model's check (:func:`model_check`) under
    ``"model"``; tree methods carry their ``num_tree_nodes``."""
    prompts = raw["prompts"]
    cats = list(dict.fromkeys(p["category"] for p in prompts))
    out = {}
    for m in methods:
        entry = _aggregate(prompts, m.name, greedy)
        entry["k"] = m.k
        if m.tree:
            entry["num_tree_nodes"] = m.tree
        if m.kind == "hf-spec" and isinstance(m.k, int) and not m.tree:  # the model is a chain's
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
        if m.kind == "baseline" or not isinstance(m.k, int) or m.tree:  # k=auto: no single k; a tree: no chain model
            continue
        check = summary[m.name].get("model")
        point = {"k": m.k, "measured": summary["baseline"]["tpot_s"] / summary[m.name]["tpot_s"],
                 "measured_total": summary[m.name]["speedup_total"], "predicted": None}
        if check:
            point.update(predicted=check["predicted"], cost_ratio=check["cost_ratio"], verify_cost=check["verify_cost"])
        out.setdefault(m.name.split("@", 1)[0], []).append(point)
    return out


#: the least a verify forward is taken to cost, in plain decoding steps: 0.89 of a step and more on this project's
#: CPUs (docs/benchmarks.md), so a third leaves room for devices whose plain step is mostly overhead; a speedup
#: above tokens per target forward / MIN_VERIFY_COST means the plain runs were slowed
MIN_VERIFY_COST = 1 / 3


def speedup_warning(name: str, speedup: float | None, tokens_per_forward: float | None,
                    plain_tpot_s: float) -> str | None:
    """A warning when ``speedup`` (over plain decoding, measured in one run) is more than ``tokens_per_forward``
    tokens per target forward can explain: above ``tokens_per_forward / MIN_VERIFY_COST``, plain decoding, not
    the method, was slow in that run (another process on the cores: a new user's 2-core run measured 18.98x at 1.2
    tokens per forward beside a test suite). ``None`` where the speedup is possible or either number is missing.

    Args:
        name: what ran, for the message.
        plain_tpot_s: plain decoding's time per output token in the run (seconds), for the message.
    """
    if not speedup or not tokens_per_forward or speedup <= tokens_per_forward / MIN_VERIFY_COST:
        return None
    return (f"{name}: {speedup:.2f}x with {tokens_per_forward:.2f} tokens per target forward is more than speculation "
            f"can give (a verify forward costs at least ~{MIN_VERIFY_COST:.2g} of a plain step): plain decoding was "
            f"slowed in this run (its TPOT {plain_tpot_s * 1000:.0f} ms), most likely by another process on the "
            "cores; rerun with the machine to itself")


#: other processes' and the hypervisor's CPU use while runs were timed, as a share of the machine's cores, above
#: which :func:`contention_warning` speaks (quiet runs on a 2-core VM measured 0.0006-0.01 cores, one spinning process
#: beside the README's command 0.84-0.89: docs/benchmarks.md, "What else ran on the CPU while a run was timed")
CONTENTION_SHARE = 0.1
#: the least timed wall-clock time judged: the kernel counts CPU time in 10 ms ticks
CONTENTION_MIN_WALL_S = 1.0


def contention_warning(shares: dict[str, tuple[float, float, float]], cores: int | None = None) -> str | None:
    """A warning when other processes or the hypervisor took more than :data:`CONTENTION_SHARE` of the machine's
    cores while runs were timed: speedups measured then are the load's as much as the method's (a new user's
    README run measured 0.29x beside a test suite, 1.74x alone). ``None`` where every entry ran with the machine
    to itself or timed less than :data:`CONTENTION_MIN_WALL_S` in all.

    Args:
        shares: per name (a method, plain decoding), ``(other_cores, steal_cores, wall_s)``: the CPU seconds other
            processes and the hypervisor took (:class:`hf_spec.device.OtherCpu`) over the ``wall_s`` seconds its
            runs were timed, and those seconds.
        cores: the machine's logical cores (default: ``psutil.cpu_count()``).
    """
    import psutil

    cores = cores or psutil.cpu_count() or 1
    loaded = {name: (other, steal) for name, (other, steal, wall) in shares.items()
              if wall >= CONTENTION_MIN_WALL_S and other + steal > CONTENTION_SHARE * cores}
    if not loaded:
        return None
    shares = ", ".join(f"{name} {other:.2f}" + (f" (and {steal:.2f} taken by the hypervisor)" if steal >= 0.01 else "")
                       for name, (other, steal) in loaded.items())
    return (f"other processes took CPU while runs were timed (cores of this machine's {cores}: {shares}): the "
            "timings and speedups measure that load too; rerun with the machine to itself")


def timing_warnings(summary: dict) -> list[str]:
    """For a bench summary: :func:`speedup_warning` for every method (the larger of its median and total-time
    speedups), then :func:`contention_warning` over every method's runs; empty where every speedup is possible
    and the runs had the CPU to themselves (or nothing says either)."""
    base = summary.get("baseline")
    if base is None:
        return []
    found = [speedup_warning(name, max(m["speedup_median"], m["speedup_total"]), m.get("mean_accepted_length"),
                             base["tpot_s"]) for name, m in summary.items() if name != "baseline"]
    found.append(contention_warning(cpu_shares(summary)))
    return [w for w in found if w]


def seconds_to_shares(timed: dict[str, tuple[float, float, float]]) -> dict[str, tuple[float, float, float]]:
    """Per name, :class:`~hf_spec.device.OtherCpu`'s ``(other_s, steal_s, wall_s)`` (summed over a name's timed
    blocks) as :func:`contention_warning` takes them: ``(other_cores, steal_cores, wall_s)``."""
    return {name: (other / wall, steal / wall, wall) if wall > 0 else (0.0, 0.0, 0.0)
            for name, (other, steal, wall) in timed.items()}


def cpu_shares(summary: dict) -> dict[str, tuple[float, float, float]]:
    """Per method of a bench summary, ``(other_cpu_cores, steal_cores, total_s)``, for :func:`contention_warning`
    (methods without the figures, as from an older results.json, are left out)."""
    return {name: (m["other_cpu_cores"], m["steal_cores"], m["total_s"])
            for name, m in summary.items() if "other_cpu_cores" in m}


#: plain decoding's TPOT in ``hf-spec tune``'s check run over its calibration run's, outside which the machine's
#: speed changed between the two (a quiet 2-core VM varies ~10% from run to run)
TPOT_DRIFT = (0.8, 1.25)


#: ``hf-spec tune``'s predicted speedup over its measured one, outside which a measurement is off (a quiet run's
#: predictions land within 2-24%: docs/benchmarks.md, "The speedup model against measurement")
PREDICTION_SPREAD = (1 / 1.5, 1.5)


def tune_warnings(verify_cost, t_plain_s: float, t_check_s: float | None = None,
                  prediction_errors: dict | None = None, shares: dict | None = None) -> list[str]:
    """Warnings for ``hf-spec tune`` measurements that something else on the machine distorted: a verify of k + 1
    positions under :data:`MIN_VERIFY_COST` of a plain step (``verify_cost[k]``, over ``t_plain_s``, plain
    decoding's TPOT in the calibration; no forward of k + 1 positions is that much cheaper than one of a single
    position: plain decoding was slowed), and, with ``t_check_s`` (plain decoding's TPOT in the check run), a
    TPOT that moved outside :data:`TPOT_DRIFT` between the two runs, and with ``prediction_errors`` (``{k:
    predicted / measured - 1}`` of the check run) a prediction outside :data:`PREDICTION_SPREAD` of its
    measurement. A new user's tune beside other work once measured T_1 = 1537 ms and T(3)/T(1) = 0.59, and 38 ms
    in the next run; another predicted 0.65x where 0.07x was measured, with neither of the other two signs. First,
    with ``shares`` (:func:`cpu_shares` of the runs), the direct sign: :func:`contention_warning`."""
    warnings = [w for w in [contention_warning(shares or {})] if w]
    warnings += [f"a verify of {k + 1} positions measured {verify_cost[k]:.2f} of a plain step, less than any forward "
                f"of {k + 1} positions costs (~{MIN_VERIFY_COST:.2g} at least): plain decoding was slowed in the "
                f"calibration (T_1 = {t_plain_s * 1000:.0f} ms), most likely by another process on the cores; rerun "
                "with the machine to itself" for k in range(1, len(verify_cost)) if verify_cost[k] < MIN_VERIFY_COST][:1]
    if t_check_s is not None and not TPOT_DRIFT[0] <= t_check_s / t_plain_s <= TPOT_DRIFT[1]:
        warnings.append(f"plain decoding's TPOT moved from {t_plain_s * 1000:.0f} ms (calibration) to "
                        f"{t_check_s * 1000:.0f} ms (check): the machine's speed changed between the two runs, most "
                        "likely another process on the cores; the predictions rest on the first, so rerun with the "
                        "machine to itself")
    off = {k: e for k, e in (prediction_errors or {}).items()
           if not PREDICTION_SPREAD[0] <= 1 + e <= PREDICTION_SPREAD[1]}
    if off:
        warnings.append("the prediction missed the measured speedup by " + ", ".join(
            f"{e:+.0%} at k = {k}" for k, e in sorted(off.items())) + ", where a quiet run's predictions land within "
            "~25%: the machine's speed changed during the runs (another process on the cores), or the drafter "
            "drafts differently in the check than in the calibration; rerun with the machine to itself before "
            "trusting the best k")
    return warnings


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


#: every file a report may hold; a report replaces them all
REPORT_FILES = ("results.json", "results.md", "speedup_by_category.png", "acceptance_by_position.png",
                "speedup_vs_k.png")


def write_report(out_dir: str | Path, config: dict, summary: dict, raw: dict, prediction: dict | None = None) -> Path:
    """Write ``results.json``, ``results.md`` and the PNG plots into ``out_dir`` (all or nothing: files are
    written to a temporary folder inside it and moved in at the end; inside, not beside it, so that a writable
    ``--out`` under a read-only folder takes its report, as ``check_out_folder`` judged it would)."""
    out_dir = Path(out_dir)
    made = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".bench-", dir=out_dir))
    done = False
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
              f"{config['date']}, commit {config['commit']}, {config['machine']}"
              f"{' (' + ', '.join(config['cpu_flags']) + ')' if config.get('cpu_flags') else ''}, "
              f"{config['threads']} threads; "
              f"{counted(config['num_prompts'], 'prompt')}, {config['max_new_tokens']} new tokens, "
              f"temperature {config['temperature']}, dtype {config['dtype']}"
              f"{', draft dtype ' + str(config['draft_dtype']) if config.get('draft_dtype') else ''}.",
              "", markdown_table(summary), ""]
        warnings = timing_warnings(summary)
        md += [f"**Timing warning.** {w}" for w in warnings] + ([""] if warnings else [])
        if model_table(summary):
            md += ["The speedup model, every input measured in this run (decode phase; see `hf_spec.bench.model_check`):",
                   "", model_table(summary), ""]
        if float(config.get("temperature") or 0) == 0:
            md += differences_table(per_prompt)
        (tmp / "results.md").write_text("\n".join(md))
        from .plots import plots

        plots(summary, tmp, prediction)
        for name in REPORT_FILES:  # an earlier report's file this one has not (a sweep's plot) would read as this one's
            if not (tmp / name).exists():
                (out_dir / name).unlink(missing_ok=True)
        for f in tmp.iterdir():
            f.replace(out_dir / f.name)
        done = True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if not done and made and not any(out_dir.iterdir()):
            out_dir.rmdir()  # a failed report leaves no folder it made
    return out_dir


def differences_table(per_prompt: list[dict]) -> list[str]:
    """Markdown lines naming every greedy output that is not plain decoding's: method, prompt, the first differing
    new token, the two tokens, the target's logit gap there and whether the compute's rounding explains it."""
    rows = []
    for p in per_prompt:
        for name, run in p["runs"].items():
            d = run.get("first_difference")
            if name == "baseline" or run.get("identical", True) or d is None:
                continue
            gap = "" if d.get("logit_gap") is None else f"{d['logit_gap']:.4g}"
            verdict = {True: f"near-tie (under {d.get('bound')})", False: "**not a near-tie**",
                       None: "no measured bound"}[d.get("near_tie")]
            if d.get("logit_gap") is None:
                verdict = "**one output stopped earlier**"
            rows.append(f"| {name} | {p['question_id']} ({p['category']}) | {d['new_token']} | {d.get('plain')!r} | "
                        f"{d.get('speculative')!r} | {gap} | {verdict} |")
    if not rows:
        return ["Every greedy output is token-identical to plain decoding.", ""]
    return ["Greedy outputs that differ from plain decoding (first differing new token; gap = the target's logit of "
            "plain's token minus speculative's, after the common prefix):", "",
            "| method | prompt | new token | plain | speculative | logit gap | verdict |", "|---|---|---|---|---|---|---|",
            *rows, ""]


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
    methods = parse_methods(config["methods"], config["ks"], config.get("draft"), config.get("trees"), flags_used=False)
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


