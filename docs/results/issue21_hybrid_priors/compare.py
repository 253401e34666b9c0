"""Issue 21's comparisons from a bench's results.json: speedup per category, medians of per-prompt ratios
(draft / hf-assisted, suffix / hf-prompt-lookup, hybrid / the better of its sources), and the hybrid's drafts
by source. Usage: compare.py RESULTS_JSON"""
import json, statistics, sys

d = json.load(open(sys.argv[1]))
names = {"draft": "draft:qwen2.5-coder-0.5b", "suffix": "suffix", "hybrid": "hybrid:draft:qwen2.5-coder-0.5b",
         "hf-assisted": "hf-assisted", "hf-prompt-lookup": "hf-prompt-lookup"}
present = {k: v for k, v in names.items() if v in d["prompts"][0]["runs"]}
print("| category (new tokens) | " + " | ".join(present) + " |")
print("|---|" + "---|" * len(present))
ratios = {"draft / hf-assisted": [], "suffix / hf-prompt-lookup": [], "hybrid / better source": []}
speed = {k: [] for k in present}
for p in d["prompts"]:
    r = p["runs"]
    base = r["baseline"]["tokens_per_s"]
    s = {k: r[v]["tokens_per_s"] / base for k, v in present.items()}
    for k in present:
        speed[k].append(s[k])
    print(f"| {p['category']} ({r['baseline']['new_tokens']}) | " + " | ".join(f"{s[k]:.2f}" for k in present) + " |")
    if "hf-assisted" in s:
        ratios["draft / hf-assisted"].append(s["draft"] / s["hf-assisted"])
    if "hf-prompt-lookup" in s:
        ratios["suffix / hf-prompt-lookup"].append(s["suffix"] / s["hf-prompt-lookup"])
    ratios["hybrid / better source"].append(s["hybrid"] / max(s["draft"], s["suffix"]))
print()
for k, v in speed.items():
    print(f"{k}: median {statistics.median(v):.2f}x, min {min(v):.2f}x")
for k, v in ratios.items():
    if v:
        print(f"{k}: median of per-prompt ratios {statistics.median(v):.2f}")
src = {}
for p in d["prompts"]:
    for name, c in (p["runs"][names["hybrid"]]["stats"].get("per_source") or {}).items():
        t = src.setdefault(name, [0, 0, 0])
        t[0] += c["drafts"]; t[1] += c["draft_tokens"]; t[2] += c["accepted_tokens"]
for name, (n, dt, a) in src.items():
    print(f"hybrid's {name} drafts: {n}, {dt} tokens drafted, {a} accepted ({a / max(1, dt):.1%})")
