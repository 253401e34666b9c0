"""Plain greedy outputs of the target on Spec-Bench (13 categories x 2 prompts, 128 new tokens), saved as token
ids, for simulating model-free drafters offline (sim.py). Run: .venv/bin/python docs/results/issue21_suffix_tree_sim/outputs.py"""
import json, sys, time
from pathlib import Path
import torch
from hf_spec.models import load
from hf_spec.prompts import load_questions, chat_inputs
from hf_spec.device import resolve_dtype

out = Path(__file__).with_name("outputs.jsonl")
model, tok = load("qwen2.5-coder-1.5b", dtype=resolve_dtype("auto"))
done = {json.loads(l)["question_id"] for l in out.open()} if out.exists() else set()
for q in load_questions(per_category=2):
    if q.question_id in done:
        continue
    ids = chat_inputs(tok, q.text)
    t = time.time()
    with torch.inference_mode():
        o = model.generate(**ids, max_new_tokens=128, do_sample=False)
    p = ids["input_ids"][0].tolist()
    with out.open("a") as f:
        f.write(json.dumps({"question_id": q.question_id, "category": q.category, "prompt": p,
                            "output": o[0, len(p):].tolist()}) + "\n")
    print(q.question_id, q.category, len(p), o.shape[1] - len(p), f"{time.time() - t:.1f}s", flush=True)
