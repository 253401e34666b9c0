"""Interleaved in one process, per prompt: the draft model's chain, 15-node tree (16 verified positions: one AMX tile of rows) and 16-node tree (17), -k auto."""
import time, torch, hf_spec, json, statistics
from hf_spec.prompts import load_questions, chat_inputs
from hf_spec.drafters.draft_model import load_draft_model, DraftModelDrafter
target, tok = hf_spec.load("qwen2.5-coder-1.5b", dtype="bfloat16")
draft, _ = load_draft_model("qwen2.5-coder-0.5b", target=target, draft_dtype="int4")
sizes = (0, 15, 16)
rows = []
for q in load_questions(per_category=2):
    enc = chat_inputs(tok, q.text)
    r = {"cat": q.category}
    for nodes in sizes:
        stats = hf_spec.SpecStats()
        t0 = time.perf_counter()
        res = target.generate(**enc, custom_generate=hf_spec.generate, return_dict_in_generate=True,
                              drafter=DraftModelDrafter(draft), num_speculative_tokens="auto",
                              **({"num_tree_nodes": nodes} if nodes else {}), max_new_tokens=128, do_sample=False,
                              event_listeners=[stats])
        dt = time.perf_counter() - t0
        n = res.sequences.shape[1] - enc["input_ids"].shape[1]
        r[nodes] = dict(tps=n / dt, mal=stats.mean_accepted_length, n=n)
    rows.append(r)
    print(r["cat"], " ".join(f"{s}: {r[s]['tps']:.2f} ({r[s]['mal']:.2f})" for s in sizes), flush=True)
json.dump([{str(k): v for k, v in r.items()} for r in rows], open("ab15.json", "w"))
for s in sizes[1:]:
    ratios = [r[s]["tps"] / r[0]["tps"] for r in rows]
    print(f"tree {s} over the chain: median {statistics.median(ratios):.3f}, faster on {sum(x > 1 for x in ratios)} of {len(ratios)}")
ratios = [r[15]["tps"] / r[16]["tps"] for r in rows]
print(f"15 over 16: median {statistics.median(ratios):.3f}, faster on {sum(x > 1 for x in ratios)} of {len(ratios)}")
