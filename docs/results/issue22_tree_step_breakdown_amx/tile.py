"""One bfloat16 F.linear of Qwen2.5-Coder-1.5B's shapes for n rows (cache-warm, median of 30): the AMX tile of 16 rows."""
import torch, time, statistics
torch.manual_seed(0)
W = [torch.randn(8960, 1536).bfloat16(), torch.randn(1536, 8960).bfloat16(), torch.randn(151936, 1536).bfloat16()]
def t(n, w, reps=30):
    x = torch.randn(n, w.shape[1]).bfloat16()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter(); torch.nn.functional.linear(x, w); ts.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(ts)
for w in W:
    print(tuple(w.shape), {n: round(t(n, w), 3) for n in (1, 8, 16, 17, 24, 32, 33)})
