"""Greedy outputs of the target (Qwen2.5-Coder-1.5B, --dtype auto) on Spec-Bench questions the bench does not use
(the 3rd and 4th of each category; the bench takes the first 1-2), for calibrating the hybrid drafter's priors.
hf-spec's draft-model loop is exact under greedy decoding, so these are the target's own outputs (bfloat16
near-ties aside). Writes outputs.json: [{question_id, category, prompt_ids, output_ids}]."""
import json, sys, time
import torch
import hf_spec
from hf_spec.device import resolve_dtype
from hf_spec.drafters.registry import make_drafter
from hf_spec.prompts import load_questions, chat_inputs

torch.manual_seed(0)
out_path = sys.argv[1]
qs = load_questions(per_category=4)
seen = {}
chosen = []
for q in qs:
    seen[q.category] = seen.get(q.category, 0) + 1
    if seen[q.category] > 2:
        chosen.append(q)
target, tok = hf_spec.load("qwen2.5-coder-1.5b", dtype=resolve_dtype("auto"))
drafter = make_drafter("draft:qwen2.5-coder-0.5b", target=target, tokenizer=tok, draft_dtype="auto")
rows = []
for q in chosen:
    t0 = time.time()
    inputs = chat_inputs(tok, q.text)
    seq = target.generate(**inputs, custom_generate=hf_spec.generate, drafter=drafter,
                          num_speculative_tokens="auto", max_new_tokens=128, do_sample=False)
    n = inputs["input_ids"].shape[1]
    rows.append(dict(question_id=q.question_id, category=q.category, prompt_ids=seq[0, :n].tolist(),
                     output_ids=seq[0, n:].tolist()))
    print(q.category, q.question_id, len(rows[-1]["output_ids"]), f"{time.time()-t0:.1f}s", flush=True)
    json.dump(rows, open(out_path, "w"))
