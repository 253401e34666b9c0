"""Feasibility: Qwen2.5-Coder-0.5B draft with int4 weight-only linears (torch's _weight_int4pack_mm_for_cpu) against
the int8 draft and bf16: one-token decode time (interleaved) and top-1 agreement with the bf16 draft on Spec-Bench text."""
import json, sys, time, statistics, functools, copy, torch
import torch.nn.functional as F
sys.path.insert(0, '/work/main')
from hf_spec.models import load
from hf_spec.kernels import quantize_draft_int8
from transformers import DynamicCache
G = int(sys.argv[1]) if len(sys.argv) > 1 else 64
LM_HEAD = (sys.argv[2] if len(sys.argv) > 2 else "int4")

def pack(w, group):
    N, K = w.shape
    wg = w.float().reshape(N, K // group, group)
    mn, mx = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
    scale = (mx - mn).clamp(min=1e-8) / 15
    q = ((wg - mn) / scale).round().clamp(0, 15).to(torch.int32).reshape(N, K)
    zero = mn + scale * 8
    sz = torch.stack([scale.reshape(N, -1), zero.reshape(N, -1)], -1).transpose(0, 1).contiguous().to(torch.bfloat16)
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1), sz

def int4_forward(m, x):
    shape = x.shape
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.reshape(-1, shape[-1]).to(torch.bfloat16), m._w4, m._g, m._sz)
    if m.bias is not None:
        y = y + m.bias
    return y.reshape(*shape[:-1], -1).to(x.dtype)

def to_int4(model, group, lm_head=True):
    n = 0
    for name, m in model.named_modules():
        if type(m) is torch.nn.Linear and (lm_head or "lm_head" not in name):
            m._w4, m._sz = pack(m.weight.data, group)
            m._g = group
            if m.bias is not None:
                m.bias.data = m.bias.data.to(torch.bfloat16)
            m.weight = None
            m.forward = functools.partial(int4_forward, m)
            n += 1
    return n

bf, tok = load("qwen2.5-coder-0.5b", dtype=torch.bfloat16)
i8, _ = load("qwen2.5-coder-0.5b", dtype=torch.float32); quantize_draft_int8(i8)
i4, _ = load("qwen2.5-coder-0.5b", dtype=torch.bfloat16)
if getattr(i4.config, "tie_word_embeddings", False):
    i4.lm_head.weight = torch.nn.Parameter(i4.lm_head.weight.data.clone())
print("int4 layers", to_int4(i4, G, LM_HEAD == "int4"), "group", G, "lm_head", LM_HEAD, flush=True)
qs = [json.loads(l) for l in open('/work/shared/specbench/question.jsonl')]
texts = [q['turns'][0] for q in qs[::40]][:12]
# agreement of top-1 next tokens over each text (teacher forcing)
agree = {"int8": [], "int4": []}
with torch.no_grad():
    for t in texts:
        ids = tok(t, return_tensors="pt").input_ids[:, :256]
        ref = bf(ids).logits.argmax(-1)
        for name, m in (("int8", i8), ("int4", i4)):
            agree[name].append((m(ids).logits.argmax(-1) == ref).float().mean().item())
print({k: round(statistics.mean(v), 3) for k, v in agree.items()}, flush=True)
# one-token decode time after a 200-token prompt, interleaved
ids = tok(texts[0], return_tensors="pt").input_ids[:, :200]
times = {"bf16": [], "int8": [], "int4": []}
with torch.no_grad():
    caches = {}
    for name, m in (("bf16", bf), ("int8", i8), ("int4", i4)):
        c = DynamicCache(); m(ids, past_key_values=c, use_cache=True); caches[name] = c
    for r in range(30):
        for name, m in (("bf16", bf), ("int8", i8), ("int4", i4)):
            c = caches[name]
            s = time.perf_counter()
            m(ids[:, -1:], past_key_values=c, use_cache=True)
            times[name].append(time.perf_counter() - s)
            c.crop(-1)
print({k: f"{statistics.median(v)*1000:.1f} ms" for k, v in times.items()})
