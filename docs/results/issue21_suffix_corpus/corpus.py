"""The target's own greedy answers to Spec-Bench questions that the benchmark does not ask (every question but the
first EXCLUDE of each category; the bench asks the first --per-category), as a corpus of past outputs for the
suffix drafter (SuffixDecoding's setting: a server that has answered earlier requests of the same workload).
Batched (left padding) in the CPU's native dtype; 128 new tokens. Appends to corpus.jsonl (resumable).
Run: .venv/bin/python docs/results/issue21_suffix_corpus/corpus.py [PER_CATEGORY=40] [EXCLUDE=2] [BATCH=16]"""
import json, sys, time
from pathlib import Path
import torch
from hf_spec.models import load
from hf_spec.prompts import load_questions, chat_inputs
from hf_spec.device import resolve_dtype

per_category = int(sys.argv[1]) if len(sys.argv) > 1 else 40
exclude = int(sys.argv[2]) if len(sys.argv) > 2 else 2
batch = int(sys.argv[3]) if len(sys.argv) > 3 else 16
out = Path(__file__).with_name("corpus.jsonl")
model, tok = load("qwen2.5-coder-1.5b", dtype=resolve_dtype("auto"))
done = {json.loads(l)["question_id"] for l in out.open()} if out.exists() else set()
asked = {q.question_id for q in load_questions(per_category=exclude)}
todo = [q for q in load_questions(per_category=per_category + exclude)
        if q.question_id not in asked and q.question_id not in done]
todo.sort(key=lambda q: len(chat_inputs(tok, q.text)["input_ids"][0]))
print(f"{len(todo)} questions to answer ({len(done)} done)", flush=True)
pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
for i in range(0, len(todo), batch):
    qs = todo[i:i + batch]
    enc = chat_inputs(tok, [q.text for q in qs])
    t = time.time()
    with torch.inference_mode():
        o = model.generate(**enc, max_new_tokens=128, do_sample=False, pad_token_id=pad)
    width = enc["input_ids"].shape[1]
    with out.open("a") as f:
        for q, row in zip(qs, o[:, width:].tolist()):
            ends = [j for j, t_ in enumerate(row) if t_ in (tok.eos_token_id, pad)]
            row = row[:ends[0]] if ends else row
            f.write(json.dumps({"question_id": q.question_id, "category": q.category, "output": row,
                                "text": tok.decode(row)}) + "\n")
    print(f"{i + len(qs)}/{len(todo)} width {width} {time.time() - t:.1f}s", flush=True)
