"""-k auto against fixed k = 3 and transformers' assisted generation on short answers (reasoning, extraction,
translation, qa: 12-34 new tokens), bfloat16 target, int8 draft (--draft-dtype auto on a CPU with VNNI), methods
interleaved (hf_spec.bench.run_bench). auto_s3 is AdaptiveK(k_start=3). Run from the repository root:

    .venv/bin/python docs/results/issue21_auto_short_answers_8x1/run.py extraction,translation,qa,reasoning 2
"""
import json, sys, statistics
import torch
from hf_spec.models import load
from hf_spec.device import resolve_dtype, draft_dtype as ddt
from hf_spec.bench import Method, run_bench
from hf_spec.bench.runner import parse_methods
from hf_spec.prompts import load_questions
from hf_spec.adaptive import AdaptiveK
torch.set_num_threads(2)
dtype = resolve_dtype("auto", None)
target, tok = load("qwen2.5-coder-1.5b", dtype=dtype)
dd = ddt(dtype, "auto", torch.device("cpu"))
cats = sys.argv[1]
per = int(sys.argv[2])
spec = "draft:qwen2.5-coder-0.5b"
ms = parse_methods(spec + ",hf-assisted", [3])
base, d3, hfa = ms
methods = [base, d3, Method("auto", "hf-spec", "auto", d3.spec), Method("auto_s3", "hf-spec", AdaptiveK(k_start=3), d3.spec), hfa]
qs = load_questions(None, cats.split(","), per)
raw = run_bench(target, tok, methods, qs, max_new_tokens=128, draft_dtype=dd, progress=False)
json.dump(raw, open("docs/results/issue21_auto_short_answers_8x1/run.json", "w"), default=str)
for p in raw["prompts"]:
    b = p["runs"]["baseline"]
    print(p["category"][:10], b["new_tokens"], *[f"{m.name[:8]} {b['total_s']/p['runs'][m.name]['total_s']:.2f}" for m in methods[1:]], flush=True)
for m in methods[1:]:
    print(m.name, "median %.3f" % statistics.median(p["runs"]["baseline"]["total_s"]/p["runs"][m.name]["total_s"] for p in raw["prompts"]))
