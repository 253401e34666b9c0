"""Interleaved per prompt, order rotated per prompt (a Latin square, so no config always runs first): the draft model's
chain, 15-node tree, 15-node tree with grafts. Usage: ab2.py ALPHA PER_CAT OUT"""
import sys, time, torch, hf_spec, json, statistics
import hf_spec.drafters.draft_model as dm
from hf_spec.prompts import load_questions, chat_inputs
from hf_spec.drafters.draft_model import load_draft_model, DraftModelDrafter
target, tok = hf_spec.load("qwen2.5-coder-1.5b", dtype="bfloat16")
draft, _ = load_draft_model("qwen2.5-coder-0.5b", target=target, draft_dtype="int4")
alpha = float(sys.argv[1])
configs = [("chain", 0, None), ("t15", 15, None), ("graft", 15, alpha)]
rows = []
for i, q in enumerate(load_questions(per_category=int(sys.argv[2]))):
    enc = chat_inputs(tok, q.text)
    r = {"cat": q.category}
    for name, nodes, a in configs[i % 3:] + configs[:i % 3]:
        dm.GRAFT_DISCOUNT = a
        stats = hf_spec.SpecStats()
        g = {"steps": 0, "graft_steps": 0, "graft_tok": 0, "graft_nodes": 0}
        def listen(ev, g=g):
            if ev.parents is None or not ev.drafted or not ev.drafted[0] or dm.LAST_GRAFT is None: return
            m = dm.LAST_GRAFT[0]
            g["steps"] += 1
            g["graft_nodes"] += int(m[:len(ev.drafted[0])].sum())
            acc = [j for j in ev.accepted_path[0][:ev.num_accepted[0]] if m[j]]
            g["graft_steps"] += bool(acc); g["graft_tok"] += len(acc)
        dm.LAST_GRAFT = None
        t0 = time.perf_counter()
        res = target.generate(**enc, custom_generate=hf_spec.generate, return_dict_in_generate=True,
                              drafter=DraftModelDrafter(draft), num_speculative_tokens="auto",
                              **({"num_tree_nodes": nodes} if nodes else {}), max_new_tokens=128, do_sample=False,
                              event_listeners=[stats, listen])
        dt = time.perf_counter() - t0
        n = res.sequences.shape[1] - enc["input_ids"].shape[1]
        r[name] = dict(tps=n / dt, mal=stats.mean_accepted_length, n=n, **g)
    rows.append(r)
    print(r["cat"], " ".join(f"{c[0]}: {r[c[0]]['tps']:.2f} ({r[c[0]]['mal']:.2f}) g{r[c[0]]['graft_steps']}/{r[c[0]]['steps']}" for c in configs), flush=True)
json.dump(rows, open(sys.argv[3], "w"))
for c in configs[1:]:
    ratios = [r[c[0]]["tps"] / r["chain"]["tps"] for r in rows]
    print(f"{c[0]} over the chain: median {statistics.median(ratios):.3f}, faster on {sum(x > 1 for x in ratios)} of {len(ratios)}; mal {statistics.mean(r[c[0]]['mal'] for r in rows):.2f}")
ratios = [r["graft"]["tps"] / r["t15"]["tps"] for r in rows]
print(f"graft over t15: median {statistics.median(ratios):.3f}, faster on {sum(x > 1 for x in ratios)} of {len(ratios)}")
