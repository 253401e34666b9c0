"""One-token forwards of the int4 draft after 200 tokens, torch.compile(dynamic=True) of its forward, profiled."""
import time, torch, sys, os
import torch._inductor.config as ic
if os.environ.get("CPPW"): ic.cpp_wrapper = True
from hf_spec.drafters.draft_model import load_draft_model
torch.set_num_threads(2)
model, tok = load_draft_model("qwen2.5-coder-0.5b", draft_dtype="int4")
ids = torch.randint(100, 20000, (1, 200))
cf = torch.compile(model.forward, dynamic=True)
with torch.no_grad():
    out = model(ids, use_cache=True); pkv = out.past_key_values
    nxt = torch.tensor([[123]])
    t0=time.perf_counter()
    for i in range(3): cf(input_ids=nxt, past_key_values=pkv, use_cache=True)
    print("compile s", time.perf_counter()-t0, flush=True)
    ts=[]
    for i in range(20):
        t=time.perf_counter(); cf(input_ids=nxt, past_key_values=pkv, use_cache=True); ts.append(time.perf_counter()-t)
    ts.sort(); print("compiled median ms", ts[10]*1e3, flush=True)
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(5): cf(input_ids=nxt, past_key_values=pkv, use_cache=True)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
