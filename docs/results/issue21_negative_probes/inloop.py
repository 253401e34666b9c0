"""In-loop draft cost of the draft model (int4), eager or with COMPILE=1 (torch.compile(dynamic=True) of the
draft's forward): python inloop.py QUESTION_ID, from the repository root (REPS=4 COMPILE=1 TORCH_LOGS=recompiles)."""
import torch, time, json, sys
import hf_spec
from hf_spec.drafters.draft_model import DraftModelDrafter, load_draft_model
from hf_spec.models import load
from hf_spec.prompts import load_questions, chat_inputs
torch.set_num_threads(2)
target, tok = load("qwen2.5-coder-1.5b", dtype=torch.bfloat16)
draft, _ = load_draft_model("qwen2.5-coder-0.5b", target=target, draft_dtype="int4")
qid = sys.argv[1] if len(sys.argv)>1 else "111"
import json as J
qs=[J.loads(l) for l in open('hf_spec/data/specbench_questions.jsonl')]
q=[x for x in qs if str(x['question_id'])==qid][0]
text = tok.apply_chat_template([{"role":"user","content":q['turns'][0]}], tokenize=False, add_generation_prompt=True)
inputs = tok(text, return_tensors="pt")
print("prompt", inputs.input_ids.shape)
import os
if os.environ.get("COMPILE"): draft.forward = torch.compile(draft.forward, dynamic=True)
d = DraftModelDrafter(draft)
from torch.profiler import profile, ProfilerActivity, record_function
for rep in range(int(os.environ.get("REPS","2"))):
    t=time.perf_counter()
    out = target.generate(**inputs, custom_generate=hf_spec.generate, drafter=d, num_speculative_tokens="auto", max_new_tokens=96, do_sample=False, return_dict_in_generate=True)
    s=out.stats
    print("total", time.perf_counter()-t, "draft_time", s.draft_time_s, "drafted", s.num_draft_tokens, "fwds", s.num_target_forwards, "verify", s.verify_time_s)
with profile(activities=[ProfilerActivity.CPU]) as prof:
    out = target.generate(**inputs, custom_generate=hf_spec.generate, drafter=d, num_speculative_tokens="auto", max_new_tokens=96, do_sample=False, return_dict_in_generate=True)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
