"""Issue 22's comparison from a bench's results.json: each tree setting of a method over its chain, per prompt
(tokens/s ratio), with the median, the prompts the tree won, and tokens per target forward over all the answers.
Usage: compare_trees.py RESULTS_JSON [CHAIN_METHOD]"""
import json, statistics, sys

d = json.load(open(sys.argv[1]))
chain = sys.argv[2] if len(sys.argv) > 2 else "draft:qwen2.5-coder-0.5b"
names = list(d["prompts"][0]["runs"])
trees = [n for n in names if n.startswith(chain + "@tree=")]
others = [n for n in names if n not in trees and n not in ("baseline", chain)]
print("| prompt (category, new tokens) | " + " | ".join(t.split("@")[1] for t in trees) + " |")
print("|---|" + "---|" * len(trees))
ratios = {t: [] for t in trees + others}
for p in d["prompts"]:
    r = p["runs"]
    c = r[chain]["tokens_per_s"]
    for t in trees + others:
        ratios[t].append(r[t]["tokens_per_s"] / c)
    print(f"| {p['question_id']} ({p['category']}, {r['baseline']['new_tokens']}) | "
          + " | ".join(f"{r[t]['tokens_per_s'] / c:.2f}" for t in trees) + " |")
print()
for t in [chain] + trees + others:
    s = lambda key: sum(p["runs"][t]["stats"][key] for p in d["prompts"])  # noqa: E731
    tpf = s("num_emitted_tokens") / max(1, s("num_target_forwards"))
    line = f"{t}: tokens per target forward {tpf:.2f}"
    if t != chain:
        v = ratios[t]
        line += f"; over the chain per prompt: median {statistics.median(v):.3f}, faster on {sum(x > 1 for x in v)} of {len(v)}"
    print(line)
