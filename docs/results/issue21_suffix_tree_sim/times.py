"""Forward times of the target by positions (chain and tree masks) after a 300-token cache, this machine, --dtype
auto: writes times.json / times_tree.json for sim.py. Run: .venv/bin/python docs/results/issue21_suffix_tree_sim/times.py"""
import json
from pathlib import Path
import torch
from hf_spec.models import load
from hf_spec.device import resolve_dtype
from hf_spec.tuning import measure_forward_times

here = Path(__file__).parent
model, tok = load("qwen2.5-coder-1.5b", dtype=resolve_dtype("auto"))
ids = torch.tensor([json.loads(l)["prompt"] + json.loads(l)["output"] for l in (here / "outputs.jsonl").open()][0][:300])[None]
ns = [1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32]
with torch.inference_mode():
    for name, tree in (("times.json", False), ("times_tree.json", True)):
        t = measure_forward_times(model, ids, ns, repeats=5, tree=tree)
        print(name, {n: round(v * 1000, 1) for n, v in t.items()}, flush=True)
        (here / name).write_text(json.dumps(t))
