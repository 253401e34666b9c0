"""Trees against chains in one bench run: for each drafter method with tree variants (METHOD@tree=N), the
speedup over plain decoding (median of per-prompt ratios and total), tokens per target forward, and each tree's
rate over its own chain per prompt; then the per-category table. Usage: compare.py RESULTS_JSON"""
import json
import statistics
import sys

d = json.load(open(sys.argv[1]))
methods = d["methods"]
chains = [m for m in methods if m != "baseline" and "@tree=" not in m and any(n.startswith(m + "@tree=") for n in methods)]
print("| method | speedup (median / total) | tokens per forward | over its chain per prompt (median; faster on) |")
print("|---|---|---|---|")
for chain in chains:
    for m in [chain] + [n for n in methods if n.startswith(chain + "@tree=")]:
        v = methods[m]
        ratios = [p["runs"][m]["tokens_per_s"] / p["runs"][chain]["tokens_per_s"] for p in d["prompts"]]
        vs = "" if m == chain else f"{statistics.median(ratios):.3f} ({sum(r > 1 for r in ratios)} of {len(ratios)})"
        print(f"| {m} | {v['speedup_median']:.2f}x / {v['speedup_total']:.2f}x | {v['mean_accepted_length']:.2f} | {vs} |")
names = [m for m in methods if m != "baseline"]
print()
print("| category | " + " | ".join(names) + " |")
print("|---|" + "---|" * len(names))
for c in methods[names[0]]["per_category"]:
    cells = [f"{methods[m]['per_category'][c]['speedup_median']:.2f}x ({methods[m]['per_category'][c]['mean_accepted_length']:.2f})"
             for m in names]
    print(f"| {c} | " + " | ".join(cells) + " |")
print()
print("plain decoding:", f"{methods['baseline']['tokens_per_s']:.2f} tok/s, TPOT {methods['baseline']['tpot_s'] * 1000:.0f} ms")
for m in names:
    print(m, "identical:", f"{methods[m]['identical_fraction']:.0%}", "accepted by position:",
          ", ".join(f"{a:.1%}" for a in methods[m]["acceptance_by_position"][:6]))
