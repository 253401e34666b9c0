"""-k auto for the draft model with its confidence stop: keeping k at the drafter's cap (on/off only, the
shipped rule since this run) against adapting k from the cap (the rule of the 13 x 2 bench before it), fixed k = 6
and transformers' assisted generation at k = 3; bfloat16 target, int8 draft, methods interleaved
(hf_spec.bench.run_bench). Run from the repository root:

    .venv/bin/python docs/results/issue21_auto_keeps_cap_8x1/run.py writing,roleplay,reasoning,coding,extraction,stem,humanities,qa 1 OUT.json
"""
import json, sys, statistics
import torch
from hf_spec import AdaptiveK
from hf_spec.models import load
from hf_spec.device import resolve_dtype, draft_dtype as ddt
from hf_spec.bench import Method, run_bench
from hf_spec.bench.runner import parse_methods
from hf_spec.drafters.draft_model import DraftModelDrafter, load_draft_model
from hf_spec.prompts import load_questions


class Adapting(DraftModelDrafter):
    """The draft model with its stop, but the controller adapting k as for any drafter (start at 6 via k_start)."""
    stops_when_unsure = False


torch.set_num_threads(2)
dtype = resolve_dtype("auto", None)
target, tok = load("qwen2.5-coder-1.5b", dtype=dtype)
dd = ddt(dtype, "auto", torch.device("cpu"))
draft, dtok = load_draft_model("qwen2.5-coder-0.5b", target, dd)
cats, per, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
spec = "draft:qwen2.5-coder-0.5b"
drafters = {spec: DraftModelDrafter(draft, tokenizer=tok, draft_tokenizer=dtok),
            spec + "#adapting": Adapting(draft, tokenizer=tok, draft_tokenizer=dtok)}
base, hfa = parse_methods("baseline,hf-assisted", [3], draft_name="qwen2.5-coder-0.5b")
methods = [base, Method("auto_keeps_6", "hf-spec", "auto", spec),
           Method("auto_adapts_from_6", "hf-spec", AdaptiveK(k_start=6), spec + "#adapting"),
           Method("k6", "hf-spec", 6, spec), hfa]
qs = load_questions(None, cats.split(","), per)
raw = run_bench(target, tok, methods, qs, max_new_tokens=128, draft_dtype=dd, progress=False, drafters=drafters)
json.dump(raw, open(out, "w"), default=str)
for p in raw["prompts"]:
    b = p["runs"]["baseline"]
    print(p["category"][:10], b["new_tokens"], *[f"{m.name} {p['runs'][m.name]['tokens_per_s']/b['tokens_per_s']:.2f}" for m in methods[1:]], flush=True)
for m in methods[1:]:
    print(m.name, "median %.3f" % statistics.median(p["runs"][m.name]["tokens_per_s"] / p["runs"]["baseline"]["tokens_per_s"] for p in raw["prompts"]),
          "total %.3f" % (sum(p["runs"]["baseline"]["total_s"] for p in raw["prompts"]) / sum(p["runs"][m.name]["total_s"] for p in raw["prompts"])),
          "vs hf-assisted %.3f" % statistics.median(p["runs"][m.name]["tokens_per_s"] / p["runs"]["hf-assisted"]["tokens_per_s"] for p in raw["prompts"]),
          "identical %d/%d" % (sum(p["runs"][m.name]["tokens"] == p["runs"]["baseline"]["tokens"] for p in raw["prompts"]), len(raw["prompts"])))
