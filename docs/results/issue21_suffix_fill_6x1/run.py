"""The suffix drafter as shipped against a "fill" suffix drafter (min_token_prob=0, no max_spec_factor: up to k
tokens whenever anything matches) and transformers' prompt lookup, bfloat16 target, 1 prompt x 6 categories,
128 new tokens, methods interleaved (hf_spec.bench.run_bench). Run from the repository root:

    .venv/bin/python docs/results/issue21_suffix_fill_6x1/run.py summarization,rag,writing,coding,qa,math 1

run1_bba2922.json also had Method("fill_3", "hf-spec", 3, "fill") after fill_auto (commit bba2922);
run2_c418081.json is this script at commit c418081 (T_1 remembered across calls, not yet keyed by prompt length).
"""
import json, sys, statistics, math
import torch
from hf_spec.models import load
from hf_spec.device import resolve_dtype
from hf_spec.bench import Method, run_bench
from hf_spec.bench.runner import parse_methods
from hf_spec.prompts import load_questions
from hf_spec.drafters.suffix import SuffixDrafter
torch.set_num_threads(2)
dtype = resolve_dtype("auto", None)
target, tok = load("qwen2.5-coder-1.5b", dtype=dtype)
cats = sys.argv[1]; per = int(sys.argv[2])
ms = parse_methods("suffix,hf-prompt-lookup", ["auto"])
base, suf, hfp = ms
fill = SuffixDrafter(3, max_spec_factor=math.inf, min_token_prob=0.0)
methods = [base, suf, Method("fill_auto", "hf-spec", "auto", "fill"), hfp]
qs = load_questions(None, cats.split(","), per)
raw = run_bench(target, tok, methods, qs, max_new_tokens=128, progress=False, drafters={"fill": fill})
json.dump(raw, open("docs/results/issue21_suffix_fill_6x1/run.json", "w"), default=str)
for p in raw["prompts"]:
    b = p["runs"]["baseline"]
    print(p["category"][:10], b["new_tokens"], *[f"{m.name[:8]} {b['total_s']/p['runs'][m.name]['total_s']:.2f}" for m in methods[1:]], flush=True)
for m in methods[1:]:
    print(m.name, "median %.3f" % statistics.median(p["runs"]["baseline"]["total_s"]/p["runs"][m.name]["total_s"] for p in raw["prompts"]))
