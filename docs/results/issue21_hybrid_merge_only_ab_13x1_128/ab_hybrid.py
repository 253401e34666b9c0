"""Interleaved, one process: 16-node trees of the draft model, the suffix drafter, the hybrid, and the hybrid whose
rows never take the suffix proposal alone (a row with a suffix match >= 2 gets it folded into the model's tree)."""
import time, torch, hf_spec, json, statistics
from hf_spec.prompts import load_questions, chat_inputs
from hf_spec.drafters.draft_model import load_draft_model, DraftModelDrafter
from hf_spec.drafters.hybrid import HybridDrafter

class MergeOnly(HybridDrafter):
    def choose_source(self, *a, **k):
        s = super().choose_source(*a, **k)
        return "model" if s == "suffix" else s

target, tok = hf_spec.load("qwen2.5-coder-1.5b", dtype="bfloat16")
draft, _ = load_draft_model("qwen2.5-coder-0.5b", target=target, draft_dtype="int4")
makers = {"draft": lambda: DraftModelDrafter(draft), "suffix": lambda: hf_spec.SuffixDrafter(),
          "hybrid": lambda: HybridDrafter(DraftModelDrafter(draft)), "merge_only": lambda: MergeOnly(DraftModelDrafter(draft))}
rows = []
for q in load_questions(per_category=1):
    enc = chat_inputs(tok, q.text)
    r = {"cat": q.category}
    for name, make in makers.items():
        stats = hf_spec.SpecStats()
        t0 = time.perf_counter()
        res = target.generate(**enc, custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=make(),
                              num_speculative_tokens="auto", num_tree_nodes=16, max_new_tokens=128, do_sample=False,
                              event_listeners=[stats])
        dt = time.perf_counter() - t0
        n = res.sequences.shape[1] - enc["input_ids"].shape[1]
        r[name] = dict(tps=n / dt, mal=stats.mean_accepted_length, n=n)
    rows.append(r)
    best = max(r["draft"]["tps"], r["suffix"]["tps"])
    print(r["cat"], " ".join(f"{k}={r[k]['tps']:.2f}" for k in makers), f"hybrid/best {r['hybrid']['tps']/best:.3f} merge_only/best {r['merge_only']['tps']/best:.3f}", flush=True)
json.dump(rows, open("ab_hybrid.json", "w"))
for name in ("hybrid", "merge_only"):
    ratios = [r[name]["tps"] / max(r["draft"]["tps"], r["suffix"]["tps"]) for r in rows]
    print(name, "over the better source, median", round(statistics.median(ratios), 3), "faster on", sum(x >= 1 for x in ratios), "of", len(ratios))
