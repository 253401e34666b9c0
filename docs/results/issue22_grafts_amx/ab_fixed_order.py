"""Interleaved per prompt: chain, 15-node tree, 15-node tree with grafts (discounts given). Usage: ab.py ALPHAS PER_CAT OUT"""
import sys, time, torch, hf_spec, json, statistics
import hf_spec.drafters.draft_model as dm
from hf_spec.prompts import load_questions, chat_inputs
from hf_spec.drafters.draft_model import load_draft_model, DraftModelDrafter
target, tok = hf_spec.load("qwen2.5-coder-1.5b", dtype="bfloat16")
draft, _ = load_draft_model("qwen2.5-coder-0.5b", target=target, draft_dtype="int4")
alphas = [float(a) for a in sys.argv[1].split(",")]
configs = [("chain", 0, None), ("t15", 15, None)] + [(f"g{a}", 15, a) for a in alphas]
rows = []
for q in load_questions(per_category=int(sys.argv[2])):
    enc = chat_inputs(tok, q.text)
    r = {"cat": q.category}
    for name, nodes, alpha in configs:
        dm.GRAFT_DISCOUNT = alpha
        d = DraftModelDrafter(draft)
        stats = hf_spec.SpecStats()
        g = {"steps": 0, "graft_acc": 0, "graft_tok": 0, "graft_nodes": 0}
        def listen(ev, d=d, g=g):
            if ev.parents is None or not ev.drafted or not ev.drafted[0]: return
            mask = getattr(d, "_last_graft", None)
            g["steps"] += 1
            if mask is None: return
            m = mask[0]
            g["graft_nodes"] += int(m[:len(ev.drafted[0])].sum())
            acc = [i for i in ev.accepted_path[0][:ev.num_accepted[0]] if m[i]]
            g["graft_acc"] += bool(acc); g["graft_tok"] += len(acc)
        t0 = time.perf_counter()
        res = target.generate(**enc, custom_generate=hf_spec.generate, return_dict_in_generate=True,
                              drafter=d, num_speculative_tokens="auto",
                              **({"num_tree_nodes": nodes} if nodes else {}), max_new_tokens=128, do_sample=False,
                              event_listeners=[stats, listen])
        dt = time.perf_counter() - t0
        n = res.sequences.shape[1] - enc["input_ids"].shape[1]
        r[name] = dict(tps=n / dt, mal=stats.mean_accepted_length, n=n, **g)
    rows.append(r)
    print(r["cat"], " ".join(f"{c[0]}: {r[c[0]]['tps']:.2f} ({r[c[0]]['mal']:.2f}) g{r[c[0]]['graft_acc']}/{r[c[0]]['steps']}" for c in configs), flush=True)
json.dump(rows, open(sys.argv[3], "w"))
for c in configs[1:]:
    ratios = [r[c[0]]["tps"] / r["chain"]["tps"] for r in rows]
    print(f"{c[0]} over the chain: median {statistics.median(ratios):.3f}, faster on {sum(x > 1 for x in ratios)} of {len(ratios)}; mal {statistics.mean(r[c[0]]['mal'] for r in rows):.2f}")
for c in configs[2:]:
    ratios = [r[c[0]]["tps"] / r["t15"]["tps"] for r in rows]
    print(f"{c[0]} over t15: median {statistics.median(ratios):.3f}, faster on {sum(x > 1 for x in ratios)} of {len(ratios)}")
