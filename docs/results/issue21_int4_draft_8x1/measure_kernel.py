"""One-token matmul cost of Qwen2.5-Coder-0.5B's linear shapes: bf16, int8 dynamic, int8 weight-only, int4 weight-only."""
import time, statistics, warnings, torch
torch.manual_seed(0)
def t(fn, n=50):
    for _ in range(5): fn()
    xs = []
    for _ in range(n):
        s = time.perf_counter(); fn(); xs.append(time.perf_counter() - s)
    return statistics.median(xs) * 1000

def int4_pack(w, group=64):
    N, K = w.shape
    wg = w.float().reshape(N, K // group, group)
    mn, mx = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
    scale = ((mx - mn).clamp(min=1e-6) / 15)
    q = ((wg - mn) / scale).round().clamp(0, 15).to(torch.int32).reshape(N, K)
    zero = mn + scale * 8   # torch's int4pack: w = (q - 8) * scale + zero
    sz = torch.stack([scale.reshape(N, K // group), zero.reshape(N, K // group)], -1).transpose(0, 1).contiguous().to(torch.bfloat16)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    deq = ((q.reshape(N, K // group, group).float() - 8) * scale + zero).reshape(N, K)
    return packed, sz, deq

shapes = {"q/o 896x896": (896, 896), "gate/up 4864x896": (4864, 896), "down 896x4864": (896, 4864), "lm_head 151936x896": (151936, 896)}
for name, (N, K) in shapes.items():
    w = torch.randn(N, K) * 0.02
    x = torch.randn(1, K)
    xb = x.bfloat16()
    wb = w.bfloat16()
    r = {}
    r["bf16"] = t(lambda: torch.nn.functional.linear(xb, wb))
    r["f32"] = t(lambda: torch.nn.functional.linear(x, w))
    lin = torch.nn.Linear(K, N, bias=False); lin.weight.data = w
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.ao.quantization import quantize_dynamic, per_channel_dynamic_qconfig
        ql = quantize_dynamic(torch.nn.Sequential(lin), {"0": per_channel_dynamic_qconfig})
    r["int8dyn"] = t(lambda: ql(x))
    scale8 = w.abs().amax(1) / 127
    w8 = (w / scale8[:, None]).round().to(torch.int8)
    r["int8wo"] = t(lambda: torch.ops.aten._weight_int8pack_mm(xb, w8, scale8.bfloat16()))
    for g in (32, 64, 128):
        packed, sz, deq = int4_pack(w, g)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(xb, packed, g, sz)
        ref = torch.nn.functional.linear(x, deq)
        err = ((y.float() - ref).abs().max() / ref.abs().max()).item()
        r[f"int4g{g}"] = t(lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(xb, packed, g, sz))
        r[f"int4g{g}_relerr"] = err
    print(name, {k: round(v, 3) for k, v in r.items()}, flush=True)
