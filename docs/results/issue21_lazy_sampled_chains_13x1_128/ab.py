"""Interleaved A/B: sampled draft-model chains (-k auto) with the target's positions processed as the rejection walk
reads them (hf_spec.loop.LAZY_DEVICES = ("cpu",), the default after this change) against all k+1 at once (()), per
prompt, the same seed for both: the outputs are the same (tests/test_tree_loop.py), only the time differs."""
import json, statistics, sys, time
import torch, hf_spec
import hf_spec.loop
from hf_spec.prompts import load_questions, chat_inputs
from hf_spec.drafters.draft_model import load_draft_model, DraftModelDrafter
target, tok = hf_spec.load("qwen2.5-coder-1.5b", dtype="bfloat16")
draft, _ = load_draft_model("qwen2.5-coder-0.5b", target=target, draft_dtype="int4")
per_cat = int(sys.argv[1]) if len(sys.argv) > 1 else 1
settings = dict(do_sample=True, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05)  # Qwen2.5-Instruct's
rows = []
for i, q in enumerate(load_questions(per_category=per_cat)):
    enc = chat_inputs(tok, q.text)
    r = {"cat": q.category}
    order = [("lazy", ("cpu",)), ("eager", ())]
    if i % 2:
        order.reverse()
    for name, lazy in order:
        hf_spec.loop.LAZY_DEVICES = lazy
        stats = hf_spec.SpecStats()
        torch.manual_seed(i)
        t0 = time.perf_counter()
        res = target.generate(**enc, custom_generate=hf_spec.generate, return_dict_in_generate=True,
                              drafter=DraftModelDrafter(draft), num_speculative_tokens="auto",
                              max_new_tokens=128, event_listeners=[stats], **settings)
        dt = time.perf_counter() - t0
        n = res.sequences.shape[1] - enc["input_ids"].shape[1]
        r[name] = dict(tps=n / dt, mal=stats.mean_accepted_length, n=n, seq=res.sequences[0].tolist())
    r["same"] = r["lazy"]["seq"] == r["eager"]["seq"]
    rows.append(r)
    print(r["cat"], f"eager {r['eager']['tps']:.2f} lazy {r['lazy']['tps']:.2f} ratio {r['lazy']['tps'] / r['eager']['tps']:.3f} "
          f"mal {r['lazy']['mal']:.2f} same {r['same']}", flush=True)
json.dump(rows, open("/work/runs/lazy_chain/ab.json", "w"))
ratios = [r["lazy"]["tps"] / r["eager"]["tps"] for r in rows]
print("median ratio", statistics.median(ratios), "faster on", sum(x > 1 for x in ratios), "of", len(ratios),
      "all same", all(r["same"] for r in rows))
