"""The draft model's confidence stop (DraftModelDrafter(confidence_threshold=...)) against fixed k and -k auto,
bfloat16 target, int8 draft (--draft-dtype auto on a CPU with VNNI), methods interleaved (hf_spec.bench.run_bench).
Run from the repository root:

    .venv/bin/python docs/results/issue21_confidence_stop_6x1/run.py writing,roleplay,math,coding,stem,rag 1 OUT.json
"""
import json, sys, statistics
import torch
from hf_spec.models import load
from hf_spec.device import resolve_dtype, draft_dtype as ddt
from hf_spec.bench import Method, run_bench
from hf_spec.bench.runner import parse_methods
from hf_spec.drafters.draft_model import DraftModelDrafter, load_draft_model
from hf_spec.prompts import load_questions
torch.set_num_threads(2)
dtype = resolve_dtype("auto", None)
target, tok = load("qwen2.5-coder-1.5b", dtype=dtype)
dd = ddt(dtype, "auto", torch.device("cpu"))
draft, dtok = load_draft_model("qwen2.5-coder-0.5b", target, dd)
cats, per, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ths = [float(x) for x in (sys.argv[4] if len(sys.argv) > 4 else "0.4").split(",")]
spec = "draft:qwen2.5-coder-0.5b"
drafters = {spec: DraftModelDrafter(draft, tokenizer=tok, draft_tokenizer=dtok, confidence_threshold=0.0)}  # no stop
base, d3, hfa = parse_methods(spec + ",hf-assisted", [3])
methods = [base, d3, Method("auto", "hf-spec", "auto", spec)]
for th in ths:
    key = f"{spec}#th{th}"
    drafters[key] = DraftModelDrafter(draft, tokenizer=tok, draft_tokenizer=dtok, confidence_threshold=th)
    methods += [Method(f"th{th}@auto", "hf-spec", "auto", key), Method(f"th{th}@k6", "hf-spec", 6, key)]
qs = load_questions(None, cats.split(","), per)
raw = run_bench(target, tok, methods, qs, max_new_tokens=128, draft_dtype=dd, progress=False, drafters=drafters)
json.dump(raw, open(out, "w"), default=str)
for p in raw["prompts"]:
    b = p["runs"]["baseline"]
    print(p["category"][:10], b["new_tokens"], *[f"{m.name} {b['total_s']/p['runs'][m.name]['total_s']:.2f}" for m in methods[1:]], flush=True)
for m in methods[1:]:
    st = [p["runs"][m.name].get("stats") for p in raw["prompts"]]
    print(m.name, "median %.3f" % statistics.median(p["runs"]["baseline"]["total_s"]/p["runs"][m.name]["total_s"] for p in raw["prompts"]),
          "total %.3f" % (sum(p["runs"]["baseline"]["total_s"] for p in raw["prompts"]) / sum(p["runs"][m.name]["total_s"] for p in raw["prompts"])),
          "identical %d/%d" % (sum(p["runs"][m.name]["tokens"] == p["runs"]["baseline"]["tokens"] for p in raw["prompts"]), len(raw["prompts"])))
