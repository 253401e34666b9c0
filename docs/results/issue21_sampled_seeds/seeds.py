"""Sampled runs of the same prompts under several seeds: per prompt, each method's speedup over plain sampling
in every run, their mean, and the hybrid against each of its sources on those means (a sampled prompt's outcome
is one sample: one run per prompt says little where single answers differ widely). Two measures: tokens/s with
the TTFT (the bench's), and the decode step alone (plain TPOT over the method's): sampled answers differ in
length from method to method, and a short one is mostly its prefill.
Usage: seeds.py RESULTS_JSON..."""
import json
import statistics
import sys

runs = [json.load(open(path)) for path in sys.argv[1:]]
names = {"draft": "draft:qwen2.5-coder-0.5b", "suffix": "suffix", "hybrid": "hybrid:draft:qwen2.5-coder-0.5b"}
measures = {"tokens/s, TTFT included": lambda r, b: r["tokens_per_s"] / b["tokens_per_s"],
            "decode step (plain TPOT / the method's)": lambda r, b: b["tpot_s"] / r["tpot_s"] if r["tpot_s"] else None}


def seed(d):
    words = d["config"]["command"].split()
    return d["config"].get("seed", int(words[words.index("--seed") + 1]) if "--seed" in words else 0)


def table(measure):
    per = {}  # (category, question) -> method -> [speedups]
    for d in runs:
        for p in d["prompts"]:
            row = per.setdefault((p["category"], p["question_id"]), {})
            for k, m in names.items():
                x = measure(p["runs"][m], p["runs"]["baseline"])
                if x is not None:
                    row.setdefault(k, []).append(x)
    print("| prompt | " + " | ".join(f"{k}: each run, mean" for k in names)
          + " | hybrid / draft | hybrid / suffix | hybrid / better |")
    print("|---|" + "---|" * (len(names) + 3))
    ratios = {"draft": [], "suffix": [], "better": []}
    for (cat, q), row in per.items():
        mean = {k: statistics.mean(v) for k, v in row.items()}
        r = {"draft": mean["hybrid"] / mean["draft"], "suffix": mean["hybrid"] / mean["suffix"]}
        r["better"] = min(r["draft"], r["suffix"])
        for k in ratios:
            ratios[k].append(r[k])
        cells = [f"{' '.join(f'{x:.2f}' for x in row[k])}, **{mean[k]:.2f}x**" for k in names]
        print(f"| {cat} {q} | " + " | ".join(cells) + f" | {r['draft']:.3f} | {r['suffix']:.3f} | {r['better']:.3f} |")
    print()
    for k, v in ratios.items():
        print(f"hybrid / {k} on the per-prompt means: median {statistics.median(v):.3f}, mean {statistics.mean(v):.3f}")


print(f"{len(runs)} runs, seeds {[seed(d) for d in runs]}")
for label, measure in measures.items():
    print(f"\n{label}:\n")
    table(measure)
print()
for k, m in names.items():
    stats = [p["runs"][m].get("stats", {}) for d in runs for p in d["prompts"]]
    a, n = sum(s.get("num_accepted_tokens", 0) for s in stats), sum(s.get("num_draft_tokens", 0) for s in stats)
    print(f"{k}: {a} of {n} drafted tokens accepted ({a / max(1, n):.1%})")
