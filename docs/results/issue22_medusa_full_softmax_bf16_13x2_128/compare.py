"""Per-category medians and the per-prompt ratio of the full-softmax heads to the sampled-softmax heads."""
import json, statistics, sys
from pathlib import Path
r = json.load(open(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("results.json")))
old, new = list(r["methods"])[1:3]
rows = r["prompts"]
sp = lambda p, m: p["runs"][m]["tokens_per_s"] / p["runs"]["baseline"]["tokens_per_s"]
tpf = lambda p, m: p["runs"][m]["stats"]["num_emitted_tokens"] / p["runs"][m]["stats"]["num_target_forwards"]
first = lambda p, m: p["runs"][m]["stats"]["accepted_per_position"][0] / p["runs"][m]["stats"]["num_drafts"]
ratio = [p["runs"][new]["tokens_per_s"] / p["runs"][old]["tokens_per_s"] for p in rows]
print(f"new/old per prompt: median {statistics.median(ratio):.3f}, faster on {sum(x > 1 for x in ratio)} of {len(ratio)}")
for m in (old, new):
    print(m, f"median speedup {statistics.median(sp(p, m) for p in rows):.2f}x, tokens per forward "
          f"{sum(p['runs'][m]['stats']['num_emitted_tokens'] for p in rows) / sum(p['runs'][m]['stats']['num_target_forwards'] for p in rows):.2f}, "
          f"first position accepted {sum(p['runs'][m]['stats']['accepted_per_position'][0] for p in rows) / sum(p['runs'][m]['stats']['num_drafts'] for p in rows):.1%}")
print("| category | sampled-softmax heads: speedup (tokens per forward) | full-softmax heads: speedup (tokens per forward) |")
print("|---|---|---|")
cats = []
for p in rows:
    if p["category"] not in cats:
        cats.append(p["category"])
for c in cats:
    ps = [p for p in rows if p["category"] == c]
    cell = lambda m: f"{statistics.median(sp(p, m) for p in ps):.2f}x ({statistics.median(tpf(p, m) for p in ps):.2f})"
    print(f"| {c} | {cell(old)} | {cell(new)} |")
