"""An int4 draft model (--draft-dtype int4: 4-bit weights in groups of 32, torch's CPU int4 kernel) against the
int8 draft (the default on CPUs with VNNI), both at -k auto with the confidence stop, the hybrid over the int4
draft, and transformers' assisted generation at k = 3 with the int4 draft; bfloat16 target, methods interleaved
(hf_spec.bench.run_bench). Run from the repository root:

    .venv/bin/python docs/results/issue21_int4_draft_8x1/run.py writing,roleplay,reasoning,coding,extraction,stem,humanities,qa 1 OUT.json
"""
import json, sys, statistics
import torch
from hf_spec.models import load
from hf_spec.device import resolve_dtype
from hf_spec.bench import Method, run_bench
from hf_spec.bench.runner import parse_methods
from hf_spec.drafters.draft_model import DraftModelDrafter, load_draft_model
from hf_spec.drafters.hybrid import HybridDrafter
from hf_spec.drafters.suffix import SuffixDrafter
from hf_spec.prompts import load_questions

torch.set_num_threads(2)
dtype = resolve_dtype("auto", None)
target, tok = load("qwen2.5-coder-1.5b", dtype=dtype)
cats, per, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
spec = "draft:qwen2.5-coder-0.5b"
drafts = {dd: load_draft_model("qwen2.5-coder-0.5b", target, dd) for dd in ("int8", "int4")}
drafters = {spec + "#" + dd: DraftModelDrafter(d, tokenizer=tok, draft_tokenizer=dt) for dd, (d, dt) in drafts.items()}
drafters["hybrid#int4"] = HybridDrafter(drafters[spec + "#int4"], SuffixDrafter(tokenizer=tok))
base, hfa = parse_methods("baseline,hf-assisted", [3], draft_name="qwen2.5-coder-0.5b")
methods = [base, Method("draft_int8", "hf-spec", "auto", spec + "#int8"),
           Method("draft_int4", "hf-spec", "auto", spec + "#int4"),
           Method("hybrid_int4", "hf-spec", "auto", "hybrid#int4"), hfa]
qs = load_questions(None, cats.split(","), per)
raw = run_bench(target, tok, methods, qs, max_new_tokens=128, draft_dtype="int4", progress=False, drafters=drafters)
json.dump(raw, open(out, "w"), default=str)
for p in raw["prompts"]:
    b = p["runs"]["baseline"]
    print(p["category"][:10], b["new_tokens"], *[f"{m.name} {p['runs'][m.name]['tokens_per_s']/b['tokens_per_s']:.2f}" for m in methods[1:]], flush=True)
for m in methods[1:]:
    print(m.name, "median %.3f" % statistics.median(p["runs"][m.name]["tokens_per_s"] / p["runs"]["baseline"]["tokens_per_s"] for p in raw["prompts"]),
          "total %.3f" % (sum(p["runs"]["baseline"]["total_s"] for p in raw["prompts"]) / sum(p["runs"][m.name]["total_s"] for p in raw["prompts"])),
          "vs hf-assisted %.3f" % statistics.median(p["runs"][m.name]["tokens_per_s"] / p["runs"]["hf-assisted"]["tokens_per_s"] for p in raw["prompts"]),
          "vs draft_int8 %.3f" % statistics.median(p["runs"][m.name]["tokens_per_s"] / p["runs"]["draft_int8"]["tokens_per_s"] for p in raw["prompts"]),
          "identical %d/%d" % (sum(p["runs"][m.name]["tokens"] == p["runs"]["baseline"]["tokens"] for p in raw["prompts"]), len(raw["prompts"])))
