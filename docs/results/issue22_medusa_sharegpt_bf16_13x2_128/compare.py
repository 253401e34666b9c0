"""Per-category table and per-prompt ratios (6-node tree over chain) of the Medusa runs with ShareGPT-trained heads
(this folder and issue22_medusa_sharegpt1100_bf16_13x2_128). Usage: compare.py RESULTS_JSON"""
import json
import statistics
import sys

d = json.load(open(sys.argv[1]))
chain, tree = list(d["methods"])[1:]
print("| category | chain: speedup (tokens per forward) | 6-node tree: speedup (tokens per forward) | chain: first head accepted |")
print("|---|---|---|---|")
for c, v in d["methods"][chain]["per_category"].items():
    t = d["methods"][tree]["per_category"][c]
    print(f"| {c} | {v['speedup_median']:.2f}x ({v['mean_accepted_length']:.2f}) | "
          f"{t['speedup_median']:.2f}x ({t['mean_accepted_length']:.2f}) | {v['acceptance_by_position'][0]:.0%} |")
rates = [(p["runs"][chain]["tokens_per_s"], p["runs"][tree]["tokens_per_s"]) for p in d["prompts"]]
print(f"tree / chain per prompt: median {statistics.median(b / a for a, b in rates):.3f}, "
      f"tree faster on {sum(b > a for a, b in rates)} of {len(rates)}")
for m in (chain, tree):
    print(m, "accepted by position:", ", ".join(f"{a:.1%}" for a in d["methods"][m]["acceptance_by_position"]))
