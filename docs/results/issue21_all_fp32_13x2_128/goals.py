"""Issue 21's goals from a bench's results.json (greedy, all seven methods; hf-spec's as chains, or as trees named
METHOD@tree=N): per-category medians of the speedups over plain decoding, each method's median of
per-prompt speedups (and on total time), and the medians of per-prompt ratios the issue names.
Methods a run lacks, and the ratios that need them, are left out (the corpus runs of
docs/results/issue21_suffix_corpus/ have no ngram; two have no hf-assisted, one no suffix).
Usage: goals.py RESULTS_JSON"""
import json
import statistics
import sys

d = json.load(open(sys.argv[1]))
runs0 = d["prompts"][0]["runs"]


def find(prefix):
    return next((m for m in runs0 if m == prefix or m.startswith(prefix + "@")), None)


names = {"draft": find("draft:qwen2.5-coder-0.5b"), "ngram": find("ngram"), "suffix": find("suffix"),
         "hybrid": find("hybrid:draft:qwen2.5-coder-0.5b"), "hf-assisted": find("hf-assisted"),
         "hf-prompt-lookup": find("hf-prompt-lookup")}
names = {k: v for k, v in names.items() if v is not None}
print("methods:", names)
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
    under += [(c, k, round(med[k], 2)) for k in ("draft", "ngram", "suffix", "hybrid") if k in med and med[k] < 0.97]
print()
total = lambda m: sum(p["runs"]["baseline"]["total_s"] for p in d["prompts"]) / sum(p["runs"][m]["total_s"] for p in d["prompts"])
for k, m in names.items():
    acc = [p["runs"][m].get("stats", {}) for p in d["prompts"]]
    tpf = sum(a.get("num_emitted_tokens", 0) for a in acc) / max(1, sum(a.get("num_target_forwards", 0) for a in acc))
    print(f"{k}: median of prompts {statistics.median(s[k] for _, s in speed):.2f}x, total time {total(m):.2f}x"
          + (f", tokens per target forward {tpf:.2f}" if tpf else ""))
ratio = lambda f: statistics.median(f(s) for _, s in speed)
faster = lambda f: sum(f(s) > 1 for _, s in speed)
ratios = (("draft / hf-assisted", ("draft", "hf-assisted"), lambda s: s['draft'] / s['hf-assisted']),
          ("suffix / hf-prompt-lookup", ("suffix", "hf-prompt-lookup"), lambda s: s['suffix'] / s['hf-prompt-lookup']),
          ("hybrid / draft", ("hybrid", "draft"), lambda s: s['hybrid'] / s['draft']),
          ("hybrid / the better of draft and suffix", ("hybrid", "draft", "suffix"),
           lambda s: s['hybrid'] / max(s['draft'], s['suffix'])))
for label, needs, f in ratios:
    if all(n in names for n in needs):
        print(f"{label}, median per prompt: {ratio(f):.3f} (faster on {faster(f)} of {len(speed)})")
per_source = {}
for p in d["prompts"]:
    for k, v in p["runs"].get(names.get("hybrid", ""), {}).get("stats", {}).get("per_source", {}).items():
        t = per_source.setdefault(k, [0, 0, 0])
        t[0] += v["drafts"]; t[1] += v["draft_tokens"]; t[2] += v["accepted_tokens"]
for k, (n, tokens, accepted) in per_source.items():
    print(f"hybrid's {k} source: {n} drafts, {tokens} tokens, {accepted} accepted ({accepted / max(1, tokens):.1%})")
print(f"hf-spec methods under 0.97x on a category median: {under}")
print(f"identical outputs: {sum(bool(r['identical']) for p in d['prompts'] for m, r in p['runs'].items() if m != 'baseline')}"
      f" of {sum(1 for p in d['prompts'] for m in p['runs'] if m != 'baseline')}; not near-ties: "
      f"{[(p['question_id'], m) for p in d['prompts'] for m, r in p['runs'].items() if r.get('first_difference') and not r['first_difference'].get('near_tie')]}")
