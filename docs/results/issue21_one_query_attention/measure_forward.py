"""One-position forward time of a model through hf_spec.ragged.RaggedCache: with the 2D mask of ones (transformers
drops it, so its sdpa attention runs enable_gqa=True) against a 4D mask (the packed form), interleaved in rounds,
after a prompt of 300 and of 1000 random tokens; medians of 15. Run from the repository root:

    .venv/bin/python docs/results/issue21_one_query_attention/measure_forward.py qwen2.5-coder-0.5b:int4 qwen2.5-coder-0.5b:int8 qwen2.5-coder-1.5b:target
"""
import torch, time, statistics, sys, json
from hf_spec.drafters.draft_model import load_draft_model
from hf_spec.models import load
from hf_spec.ragged import RaggedCache
torch.set_num_threads(2)
res = {}
def one(model, ctx, force, reps):
    r = RaggedCache(model.config, 1, "cpu"); r._one_query = force
    ids = torch.randint(100, 20000, (1, ctx))
    t = []
    with torch.no_grad():
        r.forward(model, ids)
        tok = torch.tensor([[42]])
        for i in range(reps + 1):
            t0 = time.perf_counter(); r.forward(model, tok); dt = time.perf_counter() - t0
            if i: t.append(dt)
    return t
for spec in sys.argv[1:]:
    name, kind = spec.split(":")
    if kind == "target":
        model = load(name, dtype=torch.bfloat16)[0]
    else:
        m = load_draft_model(name, draft_dtype=kind); model = m[0] if isinstance(m, tuple) else m
    model.eval()
    for ctx in (300, 1000):
        a, b = [], []
        for rnd in range(3):
            a += one(model, ctx, False, 5); b += one(model, ctx, True, 5)
        ma, mb = statistics.median(a), statistics.median(b)
        res[f"{spec}@{ctx}"] = (ma, mb)
        print(f"{spec} ctx={ctx}: no mask (enable_gqa) {ma*1e3:.1f} ms, 4D mask (packed) {mb*1e3:.1f} ms, ratio {mb/ma:.3f}  (min {min(a)*1e3:.1f} / {min(b)*1e3:.1f})", flush=True)
    del model
