"""Issue 21's goals from a bench's results.json (greedy, all seven methods): per-category medians of the
speedups over plain decoding, each method's median of per-prompt speedups, and the medians of per-prompt ratios
the issue names. Usage: goals.py RESULTS_JSON"""
import json
import statistics
import sys

d = json.load(open(sys.argv[1]))
names = {"draft": "draft:qwen2.5-coder-0.5b", "ngram": "ngram", "suffix": "suffix",
         "hybrid": "hybrid:draft:qwen2.5-coder-0.5b", "hf-assisted": "hf-assisted",
         "hf-prompt-lookup": "hf-prompt-lookup"}
speed = []  # per prompt: (category, {method: speedup})
for p in d["prompts"]:
    base = p["runs"]["baseline"]["tokens_per_s"]
    speed.append((p["category"], {k: p["runs"][v]["tokens_per_s"] / base for k, v in names.items()}))
cats = list(dict.fromkeys(c for c, _ in speed))
print("| category | " + " | ".join(names) + " |")
print("|---|" + "---|" * len(names))
under = []
for c in cats:
    med = {k: statistics.median(s[k] for cc, s in speed if cc == c) for k in names}
    print(f"| {c} | " + " | ".join(f"{med[k]:.2f}x" for k in names) + " |")
    under += [(c, k, round(med[k], 2)) for k in ("draft", "ngram", "suffix", "hybrid") if med[k] < 0.97]
print()
for k in names:
    print(f"{k}: median of prompts {statistics.median(s[k] for _, s in speed):.2f}x")
ratio = lambda f: statistics.median(f(s) for _, s in speed)
print(f"draft / hf-assisted, median per prompt: {ratio(lambda s: s['draft'] / s['hf-assisted']):.2f}")
print(f"suffix / hf-prompt-lookup: {ratio(lambda s: s['suffix'] / s['hf-prompt-lookup']):.2f}")
print(f"hybrid / the better of draft and suffix: {ratio(lambda s: s['hybrid'] / max(s['draft'], s['suffix'])):.2f}")
print(f"hf-spec methods under 0.97x on a category median: {under}")
print(f"identical outputs: {sum(r['identical'] for p in d['prompts'] for m, r in p['runs'].items() if m != 'baseline')}"
      f" of {sum(1 for p in d['prompts'] for m in p['runs'] if m != 'baseline')}")
