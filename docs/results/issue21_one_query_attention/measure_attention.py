"""One query's grouped-query attention on the CPU, the two forms transformers' sdpa attention runs: enable_gqa=True
(no mask) and the query heads packed into the query length with a boolean mask; 10th percentile of 200
alternating calls each; shapes (kv heads, query heads per kv head, head size, cached positions) of
Qwen2.5-Coder-0.5B, -1.5B and SmolLM2-135M. Run from the repository root:

    .venv/bin/python docs/results/issue21_one_query_attention/measure_attention.py
"""
import torch, time, torch.nn.functional as F
torch.set_num_threads(2)
def bench(dtype, kv, rep, d, T, n=200):
    q = torch.randn(1, kv*rep, 1, d, dtype=dtype); k = torch.randn(1, kv, T, d, dtype=dtype); v = torch.randn_like(k)
    m = torch.ones(1, 1, 1, T, dtype=torch.bool)
    def a(): return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    def b(): return F.scaled_dot_product_attention(q.reshape(1, kv, rep, d), k, v, attn_mask=m)
    ra, rb = a().reshape(1,-1,1,d), b().reshape(1,-1,1,d)
    err = (ra.float()-rb.float()).abs().max().item()
    ta, tb = [], []
    for i in range(n):
        t0 = time.perf_counter(); a(); ta.append(time.perf_counter()-t0)
        t0 = time.perf_counter(); b(); tb.append(time.perf_counter()-t0)
    ta.sort(); tb.sort()
    return ta[n//10]*1e6, tb[n//10]*1e6, err
for dtype in (torch.bfloat16, torch.float32):
    for kv, rep, d, T in ((2, 7, 64, 300), (2, 6, 128, 700), (2, 7, 64, 1500), (3, 3, 64, 300)):
        ea, eb, err = bench(dtype, kv, rep, d, T)
        print(f"{str(dtype):15s} kv={kv} rep={rep} d={d} T={T}: enable_gqa {ea:7.0f} us  packed+mask {eb:6.0f} us  ratio {ea/eb:5.2f}  maxdiff {err:.2e}")
