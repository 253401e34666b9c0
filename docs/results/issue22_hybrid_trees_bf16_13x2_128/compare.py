"""Per-prompt speedups and the medians of per-prompt ratios (tree over chain) of the hybrid-trees run.
Usage: compare.py RESULTS_JSON"""
import json
import statistics
import sys

d = json.load(open(sys.argv[1]))
methods = list(d["prompts"][0]["runs"])[1:]  # draft chain, draft tree, hybrid chain, hybrid tree
rows = []
print("| category | new tokens | " + " | ".join(methods) + " |")
print("|---|---|" + "---|" * len(methods))
for p in d["prompts"]:
    base = p["runs"]["baseline"]["tokens_per_s"]
    s = {m: p["runs"][m]["tokens_per_s"] / base for m in methods}
    rows.append(s)
    print(f"| {p['category']} | {p['runs']['baseline']['new_tokens']} | " + " | ".join(f"{s[m]:.2f}x" for m in methods) + " |")
draft, draft_tree, hybrid, hybrid_tree = methods
med = lambda f: statistics.median(f(s) for s in rows)  # noqa: E731
print(f"draft tree / chain {med(lambda s: s[draft_tree] / s[draft]):.3f}; "
      f"hybrid tree / chain {med(lambda s: s[hybrid_tree] / s[hybrid]):.3f}; "
      f"hybrid tree / draft tree {med(lambda s: s[hybrid_tree] / s[draft_tree]):.3f}; "
      f"hybrid tree / the best other {med(lambda s: s[hybrid_tree] / max(s[draft], s[draft_tree], s[hybrid])):.3f}; "
      f"hybrid tree faster than hybrid chain on {sum(s[hybrid_tree] > s[hybrid] for s in rows)} of {len(rows)}")
