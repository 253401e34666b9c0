"""``hf-spec bench`` and ``hf-spec tune``: measurements on Spec-Bench prompts (:mod:`hf_spec.bench`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

__all__ = ["run_bench_command", "run_tune"]


def run_bench_command(args) -> int:
    """``hf-spec bench``: every method beside plain decoding on Spec-Bench prompts; writes ``--out``.

    Raises:
        ValueError: bad methods, settings or categories, or a partial run in ``--out`` with other settings (before
            any model loads; a changed target, dtype or device after the target loads).
    """
    from ..bench import parse_methods, run_bench, speedup_vs_k, summarize, write_report
    from ..bench.runner import check_journal, journal_settings
    from ..device import draft_dtype as _draft_dtype
    from ..device import check_draft_dtype, machine_info, main_device, resolve_device_map, resolve_dtype
    from ..models import load
    from ..drafters.registry import DRAFTERS
    from ..prompts import load_questions
    from .generate import check_out_folder, check_sampling, draft_dtype_flag, read_corpus

    check_out_folder(args.out)
    ks = args.k_sweep or [args.k]  # [None]: each method's own k (a Medusa checkpoint's head count, ...)
    methods = parse_methods(args.methods, ks, args.draft, args.tree)  # bad methods fail before any model loads
    args.draft_dtype = draft_dtype_flag(args, _runs_a_draft_model(methods), args.methods)
    if args.corpus and not any(m.kind == "hf-spec" and DRAFTERS[m.spec.partition(":")[0]].takes_corpus
                               for m in methods):
        raise ValueError("--corpus needs a method that drafts from one: suffix, hybrid:draft:MODEL or "
                         "hybrid:medusa:DIR")
    corpus = read_corpus(args.corpus)
    try:
        import matplotlib  # noqa: F401  (the plots are written at the end: fail now, not after the run)
    except ImportError:
        raise ImportError("hf-spec bench needs matplotlib: pip install 'hf-spec[bench]'")
    if args.max_new_tokens < 1 or args.per_category < 1 or args.repeats < 1:
        raise ValueError("--max-new-tokens, --per-category and --repeats must be >= 1")
    if args.k_sweep and args.max_new_tokens < 2:
        raise ValueError("--k-sweep compares decode steps (time per output token after the first): give "
                         "--max-new-tokens >= 2")
    check_sampling(args)
    sampling = {name: value for name, value in (("top_p", args.top_p), ("top_k", args.top_k),
                                                ("repetition_penalty", args.repetition_penalty)) if value is not None}
    cats = args.categories.split(",") if args.categories else None
    questions = load_questions(args.questions, categories=cats, per_category=args.per_category)
    if not questions:
        raise ValueError(f"no questions for categories {args.categories!r}")
    journal = Path(args.out) / ".progress.json"  # an interrupted run resumes from it (same command)
    # a partial run with other settings is refused now, not after the model loads (run_bench checks the rest)
    check_journal(journal, journal_settings(methods, questions, max_new_tokens=args.max_new_tokens,
                                            temperature=args.temperature, sampling=sampling, repeats=args.repeats,
                                            seed=args.seed, corpus=corpus))
    if not journal.exists() and (Path(args.out) / "results.json").exists():
        print(f"hf-spec: {args.out} holds a finished run's results; this run replaces its results.json, results.md "
              "and plots when it ends (give another --out to keep them)", file=sys.stderr)
    device_map = resolve_device_map(args.device_map)
    check_draft_dtype(args.draft_dtype, device_map)
    dtype = resolve_dtype(args.dtype, device_map)
    draft_dtype = _draft_dtype(dtype, args.draft_dtype, main_device(device_map))
    target, tok = load(args.target, dtype=dtype, device_map=device_map)
    # the record of the code and machine as the run starts (a long run's report is written after later commits)
    machine = machine_info()
    try:
        raw = run_bench(target, tok, methods, questions, max_new_tokens=args.max_new_tokens,
                        temperature=args.temperature, repeats=args.repeats, draft_dtype=args.draft_dtype,
                        seed=args.seed, journal=journal, corpus=corpus, sampling=sampling)
    except KeyboardInterrupt:
        if journal.exists():
            print(f"hf-spec: the finished prompts are in {journal}; the same command resumes", file=sys.stderr)
        raise
    greedy = args.temperature == 0
    summary = summarize(raw, methods, greedy)
    prediction = speedup_vs_k(summary, methods) if args.k_sweep else None
    config = dict(machine, target=args.target, methods=args.methods, draft=args.draft, ks=ks, num_prompts=len(questions),
                  trees=args.tree, categories=list(dict.fromkeys(q.category for q in questions)),
                  max_new_tokens=args.max_new_tokens,
                  temperature=args.temperature, sampling=sampling, repeats=args.repeats, seed=args.seed,
                  dtype=str(dtype).replace("torch.", ""),
                  draft_dtype=str(draft_dtype).replace("torch.", "") if _runs_a_draft_model(methods) else None,
                  device_map=device_map, device=str(target.device),
                  command="hf-spec " + " ".join(sys.argv[1:]))
    out = write_report(args.out, config, summary, raw, prediction)
    journal.unlink(missing_ok=True)
    from ..bench import markdown_table, model_table, timing_warnings

    print(markdown_table(summary))
    if model_table(summary):
        print(model_table(summary))
    for warning in timing_warnings(summary):
        print(f"hf-spec: warning: {warning}", file=sys.stderr)
    print(f"written: {out}/results.json, results.md, plots")
    return 0


def run_tune(args) -> int:
    """``hf-spec tune``: measure acceptance, draft cost and verify cost in the loop; predict the best k and
    measure it beside its neighbours.

    Raises:
        ValueError: a bad drafter spec (``none`` included: nothing to tune) or setting, before any model loads.
    """
    from ..adaptive import CycleK
    from ..bench import Method, decode_time_per_token, run_bench, summarize, tune_warnings
    from ..bench.report import cpu_shares
    from ..bench.runner import check_questions_fit
    from ..prompts import counted
    from ..device import check_draft_dtype, resolve_device_map, resolve_dtype
    from ..drafters.registry import drafter_specs, make_drafter, parse_drafter
    from ..metrics import SpecStats
    from ..models import load
    from ..prompts import load_questions
    from ..tuning import conditional_acceptance, expected_speedups, in_loop_costs
    from .generate import draft_dtype_flag, uses_a_draft_model

    if args.k_max < 1:
        raise ValueError("--k-max must be >= 1")
    if args.max_new_tokens < 2 or args.per_category < 1:
        raise ValueError("tune measures decode steps (time per output token after the first): give "
                         "--max-new-tokens >= 2 and --per-category >= 1")
    spec = parse_drafter(args.drafter)
    if spec is None:
        raise ValueError("--drafter none has nothing to tune; use one of "
                         + drafter_specs().removeprefix("none | "))
    args.draft_dtype = draft_dtype_flag(args, uses_a_draft_model(spec), args.drafter)
    questions = load_questions(categories=args.categories.split(","), per_category=args.per_category)
    if not questions:
        raise ValueError(f"no questions for categories {args.categories!r}")
    device_map = resolve_device_map(args.device_map)
    check_draft_dtype(args.draft_dtype, device_map)
    dtype = resolve_dtype(args.dtype, device_map)
    target, tok = load(args.target, dtype=dtype, device_map=device_map)
    check_questions_fit(target, tok, questions, args.max_new_tokens)  # before the draft loads
    drafter = make_drafter(spec, target=target, tokenizer=tok, draft_dtype=args.draft_dtype)  # built once, both runs
    spec = str(spec)
    log = (lambda *a: None) if args.json else (lambda *a: print(*a, file=sys.stderr))
    k_max = args.k_max
    if drafter.max_num_speculative_tokens is not None and drafter.max_num_speculative_tokens < k_max:
        k_max = drafter.max_num_speculative_tokens
        log(f"{spec} proposes at most {k_max} tokens per step: k = 1..{k_max}")

    # 1. calibration: plain decoding beside the loop with k cycling 1..k_max, interleaved prompt by prompt.
    # From it: T_1 (the baseline's TPOT), the per-position acceptance, and the draft and verify cost of each k
    # as the loop spends them (isolated forwards miss the draft's catch-up and the bookkeeping).
    log(f"calibrating: k = 1..{k_max} in turn, beside plain decoding, on {counted(len(questions), 'prompt')} ...")
    cycle = CycleK(1, k_max)
    methods = [Method("baseline", "baseline"), Method(f"{spec}@k=1..{k_max}", "hf-spec", cycle, spec)]
    raw = run_bench(target, tok, methods, questions, max_new_tokens=args.max_new_tokens, draft_dtype=args.draft_dtype,
                    progress=not args.json, label="tune: calibration", drafters={spec: drafter})
    t_plain = decode_time_per_token([p["runs"]["baseline"] for p in raw["prompts"]])
    shares = {f"calibration {name}": v for name, v in cpu_shares(summarize(raw, methods, greedy=True)).items()}
    stats = SpecStats()
    for p in raw["prompts"]:
        stats.merge(p["runs"][methods[1].name]["stats"])
    acceptance = conditional_acceptance(stats) or [0.0]
    c, verify = in_loop_costs(cycle.calls[1:], t_plain, k_max)  # calls[0]: run_bench's warm-up
    predicted = expected_speedups(acceptance, c, verify)
    k_best = max(predicted, key=lambda k: (predicted[k], -k))
    pays = predicted[k_best] > 1.0
    result = {"target": args.target, "drafter": args.drafter, "t_plain_s": t_plain,
              "conditional_acceptance": acceptance, "acceptance_rate": stats.acceptance_rate,
              "cost_ratio": c, "verify_cost": verify, "predicted": predicted, "best_k": k_best,
              "speculation_pays": pays, "measured": {}}
    t_check = None  # plain decoding's TPOT in the check run
    # 2. measured speedup at the best k and its neighbours, each beside its prediction
    if not args.no_check:
        ks = sorted({k for k in (k_best - 1, k_best, k_best + 1) if 1 <= k <= k_max})
        log(f"measuring the speedup at k = {ks} ...")
        methods = [Method("baseline", "baseline")] + [Method(f"{spec}@k={k}", "hf-spec", k, spec) for k in ks]
        raw = run_bench(target, tok, methods, questions, max_new_tokens=args.max_new_tokens, draft_dtype=args.draft_dtype,
                        progress=not args.json, label="tune: check", drafters={spec: drafter})
        summary = summarize(raw, methods, greedy=True)
        t_check = summary["baseline"]["tpot_s"]
        shares.update({f"check {name}": v for name, v in cpu_shares(summary).items()})
        for m in methods[1:]:
            decode = summary["baseline"]["tpot_s"] / summary[m.name]["tpot_s"]
            result["measured"][m.k] = {
                "speedup_decode": decode,
                "speedup_total": summary[m.name]["speedup_total"],
                "speedup_median": summary[m.name]["speedup_median"],
                "identical_fraction": summary[m.name]["identical_fraction"],
                "prediction_error": predicted[m.k] / decode - 1,
            }
    result["warnings"] = tune_warnings(verify, t_plain, t_check,
                                       {k: m["prediction_error"] for k, m in result["measured"].items()}, shares)
    for warning in result["warnings"]:
        print(f"hf-spec tune: warning: {warning}", file=sys.stderr)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{args.target} + {args.drafter} on {counted(len(questions), 'prompt')}, {args.max_new_tokens} new tokens; "
          f"T_1 = {t_plain * 1000:.0f} ms (plain decoding's TPOT)")
    print("conditional acceptance by position: " + " ".join(f"{a:.2f}" for a in acceptance))
    print("| k | c | verify T(k+1)/T(1) | predicted | measured (decode) | error | measured (total) | identical |")
    print("|---|---|---|---|---|---|---|---|")
    for k, pred in predicted.items():
        m = result["measured"].get(k)
        meas = (f"{m['speedup_decode']:.2f}x | {m['prediction_error']:+.0%} | {m['speedup_total']:.2f}x | "
                f"{m['identical_fraction']:.0%}" if m else "- | - | - | -")
        print(f"| {k}{' (best)' if k == k_best else ''} | {c[k - 1]:.3f} | {verify[k]:.2f} | {pred:.2f}x | {meas} |")
    print("c and the verify cost: seconds per drafted token and per verify step inside the loop, over T_1; "
          "predicted: E[tokens per step] / (T_verify(k+1)/T_1 + k c); error: predicted / measured - 1")
    if not pays:
        print(f"No k is predicted to beat plain decoding here (the best, k = {k_best}, {predicted[k_best]:.2f}x): "
              f"decode without this drafter, or let num_speculative_tokens=\"auto\" (-k auto) switch it off where it "
              "does not pay.")
    return 0


def _runs_a_draft_model(methods) -> bool:
    """Whether any method drafts with a draft model (``draft:NAME``, ``hybrid:draft:NAME``, transformers' assisted
    generation): only then has the run a draft dtype to report."""
    from .generate import uses_a_draft_model

    return any(m.kind.startswith("hf-assisted") or (m.kind == "hf-spec" and uses_a_draft_model(m.spec)) for m in methods)
