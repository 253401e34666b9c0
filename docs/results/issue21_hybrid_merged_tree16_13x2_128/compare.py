"""The hybrid against its two sources, from a bench's results.json with baseline, draft:..., suffix and
hybrid:draft:... (chains, or trees named METHOD@tree=N): per-category medians of speedups over plain decoding, the
median of per-prompt ratios hybrid / the better source, tokens per target forward and the hybrid's drafts by source.
Usage: hybrid_compare.py RESULTS_JSON"""
import json
import statistics
import sys

d = json.load(open(sys.argv[1]))
runs0 = d["prompts"][0]["runs"]
find = lambda prefix: next(m for m in runs0 if m == prefix or m.startswith(prefix + "@"))
names = {"draft": find("draft:qwen2.5-coder-0.5b"), "suffix": find("suffix"), "hybrid": find("hybrid:draft:qwen2.5-coder-0.5b")}
print("methods:", names)
rows = []
for p in d["prompts"]:
    base = p["runs"]["baseline"]["tokens_per_s"]
    rows.append((p["category"], p["question_id"], {k: p["runs"][v]["tokens_per_s"] / base for k, v in names.items()}))
print("| category | draft | suffix | hybrid | hybrid / better source |")
print("|---|---|---|---|---|")
for c in dict.fromkeys(c for c, _, _ in rows):
    sel = [s for cc, _, s in rows if cc == c]
    med = {k: statistics.median(s[k] for s in sel) for k in names}
    r = statistics.median(s["hybrid"] / max(s["draft"], s["suffix"]) for s in sel)
    print(f"| {c} | {med['draft']:.2f}x | {med['suffix']:.2f}x | {med['hybrid']:.2f}x | {r:.2f} |")
for k, m in names.items():
    st = [p["runs"][m].get("stats", {}) for p in d["prompts"]]
    tpf = sum(a.get("num_emitted_tokens", 0) for a in st) / max(1, sum(a.get("num_target_forwards", 0) for a in st))
    tot = sum(p["runs"]["baseline"]["total_s"] for p in d["prompts"]) / sum(p["runs"][m]["total_s"] for p in d["prompts"])
    print(f"{k}: median of prompts {statistics.median(s[k] for _, _, s in rows):.2f}x, total time {tot:.2f}x, "
          f"tokens per target forward {tpf:.2f}")
ratios = [s["hybrid"] / max(s["draft"], s["suffix"]) for _, _, s in rows]
print(f"hybrid / better source, median per prompt: {statistics.median(ratios):.3f}; "
      f"over the draft model alone: {statistics.median(s['hybrid'] / s['draft'] for _, _, s in rows):.3f}; "
      f"faster than the better source on {sum(r > 1 for r in ratios)} of {len(ratios)}")
src = {}
for p in d["prompts"]:
    for s, c in (p["runs"][names["hybrid"]].get("stats", {}).get("per_source") or {}).items():
        t = src.setdefault(s, dict.fromkeys(c, 0))
        for key, v in c.items():
            t[key] += v
print("hybrid by source:", src)
print("identical:", {k: sum(p["runs"][m]["identical"] for p in d["prompts"]) for k, m in names.items()},
      "not near-ties:", [(p["question_id"], m) for p in d["prompts"] for m, r in p["runs"].items()
                         if r.get("first_difference") and not r["first_difference"].get("near_tie")])
