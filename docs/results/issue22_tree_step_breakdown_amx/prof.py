"""Per-step time breakdown: chain vs 16-node draft tree (int4 draft, bf16 target, -k auto)."""
import time, torch, hf_spec, json, statistics, sys
from hf_spec.prompts import load_questions, chat_inputs
from hf_spec.drafters.draft_model import load_draft_model, DraftModelDrafter
target, tok = hf_spec.load("qwen2.5-coder-1.5b", dtype="bfloat16")
draft, _ = load_draft_model("qwen2.5-coder-0.5b", target=target, draft_dtype="int4")
cats = sys.argv[1].split(",")
qs = [q for q in load_questions(per_category=1) if q.category in cats]
agg = {0: [], 16: []}
for q in qs:
    enc = chat_inputs(tok, q.text)
    for nodes in (0, 16):
        ev = []
        t0 = time.perf_counter()
        res = target.generate(**enc, custom_generate=hf_spec.generate, return_dict_in_generate=True,
                              drafter=DraftModelDrafter(draft), num_speculative_tokens="auto",
                              **({"num_tree_nodes": nodes} if nodes else {}), max_new_tokens=128, do_sample=False,
                              event_listeners=[ev.append])
        dt = time.perf_counter() - t0
        steps = [e for e in ev if e.step > 0]
        n = res.sequences.shape[1] - enc["input_ids"].shape[1]
        d = sum(e.draft_time_s for e in steps); v = sum(e.verify_time_s for e in steps)
        pre = ev[0].time_s
        other = ev[-1].time_s - pre - d - v
        acc = sum(len(e.emitted[0]) for e in steps) / len(steps)
        pos = statistics.mean(e.positions for e in steps)
        row = dict(cat=q.category, nodes=nodes, tps=n/dt, steps=len(steps), draft_ms=1e3*d/len(steps), verify_ms=1e3*v/len(steps),
                   other_ms=1e3*other/len(steps), tail_ms=1e3*(dt-ev[-1].time_s), acc=acc, pos=pos)
        agg[nodes].append(row)
        print(json.dumps({k: (round(x, 2) if isinstance(x, float) else x) for k, x in row.items()}), flush=True)
for nodes, rows in agg.items():
    print(nodes, {k: round(statistics.mean(r[k] for r in rows), 2) for k in ("tps", "draft_ms", "verify_ms", "other_ms", "acc", "pos")})
