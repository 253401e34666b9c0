"""Grouped-query attention of n = 2..17 new queries under a 4D mask after T cached positions, three forms, fastest
of 15 calls each after a warm-up: transformers' sdpa form with a mask (each key/value head repeated per query head,
``repeat_kv``, then the many-head kernel), ``enable_gqa=True`` with the mask, and the query heads packed into the
query length against the unrepeated keys and values (hf_spec.kernels.packed_sdpa_attention). Also the largest
difference between the outputs. Run from the repository root:

    .venv/bin/python docs/results/issue21_packed_attention/measure_attention.py bfloat16
    .venv/bin/python docs/results/issue21_packed_attention/measure_attention.py float32
"""
import sys
import time

import torch
import torch.nn.functional as F

torch.manual_seed(0)


def repeat(x, g):
    b, h, s, d = x.shape
    return x[:, :, None].expand(b, h, g, s, d).reshape(b, h * g, s, d)


def fastest(fn, r=15):
    fn()
    ts = []
    for _ in range(r):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return min(ts) * 1e6


dtype = getattr(torch, sys.argv[1]) if len(sys.argv) > 1 else torch.bfloat16
print(f"# {dtype}, torch {torch.__version__}, {torch.get_num_threads()} threads; microseconds per call")
for hkv, g, d, name in [(2, 6, 128, "Qwen2.5-Coder-1.5B"), (2, 7, 64, "Qwen2.5-Coder-0.5B"), (3, 3, 64, "SmolLM2-135M")]:
    for T in (300, 1000):
        for n in (2, 4, 5, 8, 17):
            q = torch.randn(1, hkv * g, n, d, dtype=dtype)
            k, v = torch.randn(1, hkv, T, d, dtype=dtype), torch.randn(1, hkv, T, d, dtype=dtype)
            m = torch.ones(1, 1, n, T, dtype=torch.bool)
            m[..., T - n:] = torch.tril(torch.ones(n, n, dtype=torch.bool))
            qp, mp = q.reshape(1, hkv, g * n, d), m.repeat(1, 1, g, 1)
            forms = {"repeat_kv": lambda: F.scaled_dot_product_attention(q, repeat(k, g), repeat(v, g), attn_mask=m),
                     "enable_gqa": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True),
                     "packed": lambda: F.scaled_dot_product_attention(qp, k, v, attn_mask=mp).reshape(1, hkv * g, n, d)}
            ref = forms["repeat_kv"]()
            diff = max((forms[f]() - ref).abs().max().item() for f in ("enable_gqa", "packed"))
            print(f"{name} {hkv}x{g}x{d} T={T} n={n:2d} " + "  ".join(f"{f} {fastest(fn):6.0f}" for f, fn in forms.items())
                  + f"  max diff {diff:.3g}", flush=True)
