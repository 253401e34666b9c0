"""Combine ``hf-spec bench`` runs of the same settings into one report: each prompt is taken from the last
run that has it, so prompts re-run later (e.g. because something else shared the CPU while they ran)
replace the first measurements. The runs must have the same target, methods, ks, tree sizes, token count,
sampling settings, dtypes and device; they may cover different categories (a long run split in parts).

    python scripts/combine_bench.py --out DIR FIRST_RUN_DIR RERUN_DIR ...
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hf_spec.bench import load_results, markdown_table, model_table, summarize, write_report

SAME = ("target", "methods", "draft", "ks", "trees", "max_new_tokens", "temperature", "sampling", "repeats", "dtype",
        "draft_dtype", "device")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="bench output folders (with results.json), earliest first")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    config, raw, methods = load_results(Path(args.runs[0]) / "results.json")
    prompts = {q["question_id"]: q for q in raw["prompts"]}
    replaced = []
    for run in args.runs[1:]:
        other, other_raw, _ = load_results(Path(run) / "results.json")
        diff = [k for k in SAME if other.get(k) != config.get(k)]
        if diff:
            raise SystemExit(f"combine_bench: {run} differs in {diff}; only runs of the same settings combine")
        for q in other_raw["prompts"]:
            if q["question_id"] in prompts:
                replaced.append(q["question_id"])
            prompts[q["question_id"]] = q
    raw = {"prompts": list(prompts.values())}  # the first run's order; a prompt only a later run has comes last
    summary = summarize(raw, methods, config["temperature"] == 0)
    categories = list(dict.fromkeys(q["category"] for q in raw["prompts"]))  # runs may cover different categories
    config = dict(config, num_prompts=len(raw["prompts"]), categories=categories, combined_from=[str(r) for r in args.runs],
                  replaced_question_ids=replaced,
                  command="python scripts/combine_bench.py " + " ".join(sys.argv[1:]))
    out = write_report(args.out, config, summary, raw)
    print(markdown_table(summary))
    if model_table(summary):
        print(model_table(summary))
    print(f"written: {out} ({len(replaced)} prompts replaced by later runs: {', '.join(replaced)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
