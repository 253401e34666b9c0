"""Interleaved in one process, per prompt: the draft model's chain and trees of the given sizes (-k auto).
Usage: ab_size.py [SIZES [OUT_JSON]], default 0,16,24 ab_size.json (0: the chain, first); the last line compares the
last two sizes (24 over 16 by default)."""
import sys, time, torch, hf_spec, json, statistics
from hf_spec.prompts import load_questions, chat_inputs
from hf_spec.drafters.draft_model import load_draft_model, DraftModelDrafter
target, tok = hf_spec.load("qwen2.5-coder-1.5b", dtype="bfloat16")
draft, _ = load_draft_model("qwen2.5-coder-0.5b", target=target, draft_dtype="int4")
sizes = tuple(int(s) for s in (sys.argv[1] if len(sys.argv) > 1 else "0,16,24").split(","))
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
json.dump([{str(k): v for k, v in r.items()} for r in rows], open(sys.argv[2] if len(sys.argv) > 2 else "ab_size.json", "w"))
for s in sizes[1:]:
    ratios = [r[s]["tps"] / r[0]["tps"] for r in rows]
    print(f"tree {s} over the chain: median {statistics.median(ratios):.3f}, faster on {sum(x > 1 for x in ratios)} of {len(ratios)}")
a, b = sizes[-1], sizes[-2]
ratios = [r[a]["tps"] / r[b]["tps"] for r in rows]
print(f"{a} over {b}: median {statistics.median(ratios):.3f}, faster on {sum(x > 1 for x in ratios)} of {len(ratios)}")
