"""A verify forward of n = 2..17 positions through hf_spec.ragged.RaggedCache after 300 and 1000 random tokens:
transformers' sdpa attention (repeat_kv) against packed grouped-query attention (hf_spec.kernels.packed_attention),
each on its own cache, interleaved, medians of 7; the largest logit difference between the two and whether every
argmax agrees (random tokens: flat distributions, so a bfloat16 near-tie can flip one). Run from the repository root:

    .venv/bin/python docs/results/issue21_packed_attention/measure_forward.py qwen2.5-coder-1.5b bfloat16
    .venv/bin/python docs/results/issue21_packed_attention/measure_forward.py qwen2.5-coder-0.5b int4
"""
import torch, time, sys
from hf_spec.models import load
from hf_spec.ragged import RaggedCache
import hf_spec.ragged as rg
from hf_spec.drafters.draft_model import load_draft_model
torch.manual_seed(0)
name, dt = sys.argv[1], sys.argv[2]
if dt in ("int4", "int8"):
    model, _ = load_draft_model(name, draft_dtype=dt)
else:
    model, _ = load(name, dtype=getattr(torch, dt))
real = rg.packed_attention_pays
for ctx in (300, 1000):
    ids = torch.randint(100, 10000, (1, ctx))
    caches = {}
    with torch.no_grad():
        for forced in (False, True):
            rg.packed_attention_pays = lambda c, d, dev, q, f=forced: f
            caches[forced] = RaggedCache(model.config, 1, "cpu"); caches[forced].forward(model, ids)
    for n in (2, 4, 5, 8, 17):
        blk = torch.randint(100, 10000, (1, n))
        res = {}; times = {False: [], True: []}
        with torch.no_grad():
            for i in range(7):
                for forced in (False, True):
                    rg.packed_attention_pays = lambda c, d, dev, q, f=forced: f
                    rc = caches[forced]
                    t = time.perf_counter(); out = rc.forward(model, blk, logits_to_keep=n).logits; times[forced].append(time.perf_counter() - t)
                    rc.truncate(torch.tensor([ctx])); res[forced] = out
        med = lambda x: sorted(x)[len(x)//2]*1e3
        print(f"{name} {dt} ctx={ctx} n={n:2d} repeat_kv {med(times[False]):6.1f} ms  packed {med(times[True]):6.1f} ms  "
              f"ratio {med(times[True])/med(times[False]):.3f}  max|dlogit| {(res[True]-res[False]).abs().max().item():.3g}  "
              f"argmax same {bool((res[True].argmax(-1)==res[False].argmax(-1)).all())}", flush=True)
rg.packed_attention_pays = real
print("measured choice:", {n: real(model.config, model.dtype, "cpu", n) for n in (2, 4, 5, 8, 17)})
import hf_spec.kernels as K; print(K.measured_attention())
