"""The shipped int4 draft (hf_spec.kernels.quantize_draft_int4 through load_draft_model): top-1 agreement with the
bfloat16 draft on Spec-Bench prompts (teacher forcing), and a decode forward's time for B rows (one new token each
after a 200-token prompt) with the int4 path forced against the bfloat16 path forced, interleaved: where
INT4_MAX_ROWS should sit. Run from the repository root: .venv/bin/python docs/results/issue21_int4_draft_8x1/measure_shipped.py
"""
import json, statistics, time, torch
from transformers import DynamicCache
from hf_spec import kernels
from hf_spec.drafters.draft_model import load_draft_model
from hf_spec.prompts import load_questions

torch.set_num_threads(2)
bf, tok = load_draft_model("qwen2.5-coder-0.5b", None, "bfloat16")
i8, _ = load_draft_model("qwen2.5-coder-0.5b", None, "int8")
i4, _ = load_draft_model("qwen2.5-coder-0.5b", None, "int4")
texts = [q.text for q in load_questions()][::40][:12]
agree = {"int8": [], "int4": []}
kernels.INT4_MAX_ROWS = 10 ** 6  # teacher forcing feeds 256 rows at once: force the drafting (int4) path
with torch.no_grad():
    for t in texts:
        ids = tok(t, return_tensors="pt").input_ids[:, :256]
        ref = bf(ids).logits.argmax(-1)
        for name, m in (("int8", i8), ("int4", i4)):
            agree[name].append((m(ids).logits.argmax(-1) == ref).float().mean().item())
print("top-1 agreement with bfloat16:", {k: round(statistics.mean(v), 3) for k, v in agree.items()}, flush=True)
ids = tok(texts[0], return_tensors="pt").input_ids[:, :200]
for rows in (1, 4, 8, 12, 16, 32):
    batch = ids.expand(rows, -1)
    times = {"int4": [], "bfloat16": [], "int8": []}
    with torch.no_grad():
        caches = {}
        for name, m in (("int4", i4), ("int8", i8)):
            c = DynamicCache(); m(batch, past_key_values=c, use_cache=True); caches[name] = c
        for r in range(10):
            for name, m, limit in (("int4", i4, 10 ** 6), ("bfloat16", i4, 0), ("int8", i8, 0)):
                kernels.INT4_MAX_ROWS = limit
                c = caches["int8" if name == "int8" else "int4"]
                s = time.perf_counter()
                m(batch[:, -1:], past_key_values=c, use_cache=True)
                times[name].append(time.perf_counter() - s)
                c.crop(-1)
    print(f"{rows} rows: " + ", ".join(f"{k} {statistics.median(v) * 1000:.1f} ms" for k, v in times.items()), flush=True)
