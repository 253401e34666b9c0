"""Run at commit f0c58ce (TREE_EXPAND exists there only). Interleaved A/B: draft-model 16-node trees with TREE_EXPAND = 1 (the chain with siblings) and 2, per prompt."""
import time, torch, hf_spec, json, statistics
from hf_spec.prompts import load_questions, chat_inputs
from hf_spec.drafters.draft_model import load_draft_model, DraftModelDrafter
import hf_spec.drafters.draft_model as dm
target, tok = hf_spec.load("qwen2.5-coder-1.5b", dtype="bfloat16")
draft, _ = load_draft_model("qwen2.5-coder-0.5b", target=target, draft_dtype="int4")
rows = []
for q in load_questions(per_category=2):
    enc = chat_inputs(tok, q.text)
    r = {"cat": q.category}
    for expand in (1, 2):
        dm.TREE_EXPAND = expand
        stats = hf_spec.SpecStats()
        t0 = time.perf_counter()
        res = target.generate(**enc, custom_generate=hf_spec.generate, return_dict_in_generate=True,
                              drafter=DraftModelDrafter(draft), num_speculative_tokens="auto", num_tree_nodes=16,
                              max_new_tokens=128, do_sample=False, event_listeners=[stats])
        dt = time.perf_counter() - t0
        n = res.sequences.shape[1] - enc["input_ids"].shape[1]
        r[expand] = dict(tps=n / dt, mal=stats.mean_accepted_length, n=n)
    rows.append(r)
    print(r["cat"], f"{r[1]['tps']:.2f} {r[2]['tps']:.2f} ratio {r[2]['tps'] / r[1]['tps']:.3f} mal {r[1]['mal']:.2f} {r[2]['mal']:.2f}", flush=True)
json.dump(rows, open("ab.json", "w"))
ratios = [r[2]["tps"] / r[1]["tps"] for r in rows]
print("median ratio", statistics.median(ratios), "faster on", sum(x > 1 for x in ratios), "of", len(ratios))
print("total tps", sum(r[1]["n"] for r in rows) / sum(r[1]["n"] / r[1]["tps"] for r in rows), sum(r[2]["n"] for r in rows) / sum(r[2]["n"] / r[2]["tps"] for r in rows))
