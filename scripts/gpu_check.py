"""One command for a borrowed GPU machine (one H200, 10 minutes a command, PyTorch and transformers
preinstalled, nothing downloadable, no real checkpoint carried): within 8 minutes it

1. measures, on random-weight models built from the real configs (written below: Qwen2.5-Coder-1.5B-Instruct
   target, Qwen2.5-Coder-0.5B-Instruct draft, Qwen2.5-7B-Instruct), in bfloat16, every clock read after
   ``torch.cuda.synchronize`` (:func:`hf_spec.device.clock`), medians of repeats after a warm-up:
   the verify cost T_verify(n)/T_1 for n = 1..16 new positions after a 256-token cache, as a chain (causal)
   and as a tree (the root and a binary tree under it, the loop's tree attention mask), and the draft cost c
   (per drafted token, over one target decode step) of the 0.5B draft, Medusa heads (random, shared
   ``lm_head``) and n-gram lookup; AWQ-INT4 only where gptqmodel imports (else one line says it is skipped);
2. prints the speedup that hf-spec's speedup model (:func:`hf_spec.tuning.expected_speedup`, checked against
   measurement on CPUs in docs/benchmarks.md) predicts from those GPU costs and the acceptance rates
   measured on the CPU for the same pair (read from docs/results/), a table with both inputs;
3. runs the conformance matrix on CUDA: ``pytest tests/test_conformance.py`` (split over ``--jobs`` processes) with ``HF_SPEC_TEST_DEVICE=cuda``
   in bfloat16 and in float32 (greedy identity and the sampling test on tiny random models), and reports
   the pass/fail counts.

    python scripts/gpu_check.py --out gpu-check            # on the GPU machine: results.json, results.md
    python scripts/gpu_check.py --device cpu --tiny        # the same code on small configs, on a CPU (seconds)

Without CUDA (and without ``--device cpu``) it prints one line and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the working tree's hf_spec, installed or not

import torch  # noqa: E402

#: the real configs (read from the provisioned checkpoints' config.json on 2026-12-01; 7B from the hub's
#: Qwen2.5-7B-Instruct). The 0.5B is tied on the hub; the provisioned (GGUF) copy unties it: same compute.
CONFIGS = {
    "qwen2.5-coder-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                               num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=False),
    "qwen2.5-coder-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                               num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=False),
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
}
COMMON = dict(model_type="qwen2", hidden_act="silu", max_position_embeddings=32768, rms_norm_eps=1e-6,
              rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, use_sliding_window=False,
              bos_token_id=151643, eos_token_id=151645)
#: --tiny: the same shapes' kinds, small enough for a CPU smoke run in seconds
TINY = {
    "qwen2.5-coder-1.5b": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
                               num_key_value_heads=2, vocab_size=2048, tie_word_embeddings=False),
    "qwen2.5-coder-0.5b": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, vocab_size=2048, tie_word_embeddings=False),
    "qwen2.5-7b": dict(hidden_size=192, intermediate_size=384, num_hidden_layers=4, num_attention_heads=6,
                       num_key_value_heads=2, vocab_size=2048, tie_word_embeddings=False),
}
#: target -> draft model (the 7B with the 0.5B: the canonical padded-vocabulary pair)
PAIRS = {"qwen2.5-coder-1.5b": "qwen2.5-coder-0.5b", "qwen2.5-7b": "qwen2.5-coder-0.5b"}
#: the CPU measurements whose acceptance rates feed the prediction (Qwen2.5-Coder-1.5B target, greedy)
CPU_RESULTS = {
    "draft:qwen2.5-coder-0.5b": ("docs/results/bench_qwen15b_13x2_128/results.json", "draft:qwen2.5-coder-0.5b"),
    "ngram": ("docs/results/bench_qwen15b_13x2_128/results.json", "ngram"),
    "medusa (hf-spec heads)": ("docs/results/bench_qwen15b_medusa_6x3_64/results.json",
                               "medusa:qwen2.5-coder-1.5b@k=2"),
}
MEDUSA_HEADS = 4


def build(name: str, tiny: bool, device: torch.device, dtype: torch.dtype):
    """A random-weight model of ``name``'s config, initialised on ``device`` (fast on a GPU)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(**{**COMMON, **(TINY if tiny else CONFIGS)[name], **(dict(bos_token_id=0, eos_token_id=1) if tiny else {})})
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def drafter_costs(target, draft, context: torch.LongTensor, t1: float, repeats: int) -> dict[str, float]:
    """c per drafted token over T_1: the draft model's decode step, Medusa heads (all heads, one pass, per head),
    n-gram lookup (k = 3 tokens on the context, per token)."""
    from hf_spec.device import clock
    from transformers import GenerationConfig

    from hf_spec.drafters.ngram import NgramDrafter
    from hf_spec.medusa.heads import MedusaConfig, MedusaHeads
    from hf_spec.tuning import measure_forward_times

    costs = {"draft:qwen2.5-coder-0.5b": measure_forward_times(draft, context.to(draft.device), [1], repeats)[1] / t1}
    H, V = target.config.hidden_size, target.get_output_embeddings().weight.shape[0]
    heads = MedusaHeads(MedusaConfig(MEDUSA_HEADS, 1, H, V, "shared-lm-head")).to(target.device, target.dtype)
    heads.bind(target)
    hidden = torch.randn(1, H, device=target.device, dtype=target.dtype)
    # bound to a call as the loop binds it; the first (untimed) draft indexes the context, later ones cost a step's
    ngram, seq, device = NgramDrafter(3).start(target, context, GenerationConfig()), context[0], target.device

    def median_time(fn) -> float:
        runs = []
        for _ in range(repeats + 1):
            t0 = clock(device)
            fn()
            runs.append(clock(device) - t0)
        return statistics.median(runs[1:])

    with torch.no_grad():
        costs["medusa (hf-spec heads)"] = median_time(lambda: heads(hidden).argmax(-1)) / MEDUSA_HEADS / t1
    costs["ngram"] = median_time(lambda: ngram.draft([seq], 3)) / 3 / t1
    return costs


def measure(args, device: torch.device, log) -> dict:
    """Per target: T_1, T_verify(n)/T_1 for chains and trees, and the drafters' c."""
    from hf_spec.tuning import measure_forward_times

    dtype = getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(0)
    out, drafts = {}, {}
    n_all = list(range(1, args.n_max + 1))
    for target_name in args.targets.split(","):
        draft_name = PAIRS[target_name]
        t_start = time.perf_counter()
        target = build(target_name, args.tiny, device, dtype)
        if draft_name not in drafts:
            drafts[draft_name] = build(draft_name, args.tiny, device, dtype)
        vocab = target.config.vocab_size
        context = torch.randint(0, min(vocab, 151643), (1, args.context), generator=gen).to(device)
        chain = measure_forward_times(target, context, n_all, args.repeats)
        tree = measure_forward_times(target, context, n_all, args.repeats, tree=True)
        t1 = chain[1]
        costs = drafter_costs(target, drafts[draft_name], context, t1, args.repeats)
        out[target_name] = {"draft": draft_name, "t1_s": t1,
                            "verify_chain": [chain[n] / t1 for n in n_all],
                            "verify_tree": [tree[n] / t1 for n in n_all], "cost_ratio": costs,
                            "seconds": time.perf_counter() - t_start}
        n = min(4, args.n_max)
        log(f"{target_name}: T_1 = {t1 * 1000:.2f} ms; T_verify({n})/T_1 chain {chain[n] / t1:.2f}, "
            f"tree {tree[n] / t1:.2f}; c draft {costs['draft:qwen2.5-coder-0.5b']:.3f} "
            f"({time.perf_counter() - t_start:.0f} s)")
        del target
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def awq_check(log) -> dict:
    """AWQ-INT4 kernels (gptqmodel, what transformers loads AWQ checkpoints with): not measured by this script;
    the line says whether they could be here."""
    import importlib.util

    if importlib.util.find_spec("gptqmodel") is None:
        reason = "gptqmodel is not installed here (its wheels do not travel in 64 MiB)"
    else:
        reason = ("gptqmodel is installed, but this script builds no random-weight AWQ-INT4 layers: time a real "
                  "AWQ checkpoint with hf-spec tune --target DIR")
    log(f"AWQ-INT4: skipped: {reason}")
    return {"measured": False, "reason": reason}


def cpu_acceptance() -> dict[str, dict]:
    """Conditional acceptance by position measured on the CPU (greedy, Qwen2.5-Coder-1.5B target), with the
    CPU costs and speedups of the same runs, from the result files in docs/results/."""
    out = {}
    for method, (path, key) in CPU_RESULTS.items():
        m = json.loads((ROOT / path).read_text())["methods"][key]
        model = m.get("model")
        if model:
            acceptance = model["conditional_acceptance"]
        else:  # a drafter that always drafts k: acceptance by position is P(first i accepted); condition it
            p = m["acceptance_by_position"]
            acceptance = [p[0]] + [p[i] / p[i - 1] if p[i - 1] else 0.0 for i in range(1, len(p))]
        out[method] = {"conditional_acceptance": acceptance, "source": f"{path} ({key})",
                       "cpu_cost_ratio": model["cost_ratio"] if model else None,
                       "cpu_verify_cost": model["verify_cost"] if model else None,
                       "cpu_speedup_decode": model["measured"] if model else None}
    return out


def predict(costs: dict, acceptance: dict) -> dict:
    """Per target and method: the speedup model's prediction for k = 1..(positions measured on the CPU), as far
    as the verify costs reach."""
    from hf_spec.tuning import expected_speedup

    out = {}
    for target_name, m in costs.items():
        for method, acc in acceptance.items():
            c = m["cost_ratio"][method]
            ks = range(1, min(len(acc["conditional_acceptance"]), len(m["verify_chain"]) - 1) + 1)
            pred = {k: expected_speedup(acc["conditional_acceptance"], k, c, m["verify_chain"]) for k in ks}
            best = max(pred, key=lambda k: (pred[k], -k))
            out.setdefault(target_name, {})[method] = {"c": c, "predicted": pred, "best_k": best}
    return out


def conformance(dtypes: list[str], device: str, jobs: int, deadline: float, log) -> dict:
    """``pytest tests/test_conformance.py`` on ``device`` in each dtype, its tests split into ``jobs`` processes
    per dtype, all at once (tiny models leave a GPU mostly idle: the matrix took 14 minutes on a 2-core CPU),
    stopped at ``deadline`` (a ``time.perf_counter()`` value). Counts from pytest's summary lines, or from
    their progress characters when stopped."""
    t0 = time.perf_counter()
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    listed = subprocess.run(pytest + ["--collect-only", "tests/test_conformance.py"], cwd=ROOT, capture_output=True,
                            text=True, timeout=120).stdout
    ids = [ln for ln in listed.splitlines() if ln.startswith("tests/test_conformance.py::")]
    shards = [ids[i::jobs] for i in range(jobs) if ids[i::jobs]] or [["tests/test_conformance.py"]]
    procs = [(dtype, subprocess.Popen(pytest + shard, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, env=dict(os.environ, HF_SPEC_TEST_DEVICE=device, HF_SPEC_TEST_DTYPE=dtype)))
             for dtype in dtypes for shard in shards]
    out = {d: {"returncode": 0, "timed_out": False, "counts": {}, "failed": [], "tests": len(ids), "tail": ""} for d in dtypes}
    for dtype, proc in procs:
        try:
            text, _ = proc.communicate(timeout=max(1.0, deadline - time.perf_counter()))
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            proc.kill()
            text, rc = proc.communicate()[0], None
        lines = text.strip().splitlines()
        counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)",
                                                    lines[-1] if lines else "")}
        if rc is None:  # stopped: count the progress characters
            dots = "".join(ln.split(" [")[0] for ln in lines if re.fullmatch(r"[.FEsx]+( +\[ *\d+%\])?", ln.strip()))
            counts = {"passed": dots.count("."), "failed": dots.count("F"), "errors": dots.count("E"),
                      "skipped": dots.count("s")}
        r = out[dtype]
        r["returncode"] = rc if rc is None or r["returncode"] is None else max(r["returncode"], rc)
        r["timed_out"] |= rc is None
        for k, n in counts.items():
            r["counts"][k] = r["counts"].get(k, 0) + n
        r["failed"] += [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))]
        r["tail"] += text[-1500:]
        r["seconds"] = time.perf_counter() - t0
    for dtype, r in out.items():
        summary = ", ".join(f"{n} {k}" for k, n in r["counts"].items() if n) or (
            "none finished" if r["timed_out"] else f"exit {r['returncode']}")
        log(f"conformance on {device}, {dtype}: {summary} of {r['tests']}"
            + (" (stopped at the time limit)" if r["timed_out"] else "") + f" ({r['seconds']:.0f} s)")
    return out


def markdown(result: dict) -> str:
    lines = [f"# GPU check ({result['machine']['device']}, {result['machine']['date']}, commit {result['machine']['commit']})", "",
             f"torch {result['machine']['torch']}, transformers {result['machine']['transformers']}; random-weight models "
             f"with the real configs, {result['settings']['dtype']}, {result['settings']['context']}-token cache, "
             f"median of {result['settings']['repeats']} after a warm-up"
             + (", every clock read after a CUDA synchronize" if result["settings"]["device"].startswith("cuda") else "")
             + (" (--tiny: small configs, not the real ones)" if result["settings"]["tiny"] else "") + ".", ""]
    costs = result["costs"]
    if costs:
        n_max = result["settings"]["n_max"]
        lines += ["## Verify cost T_verify(n)/T_1", "", "| target | T_1 | kind | " + " | ".join(f"n={n}" for n in range(1, n_max + 1)) + " |",
                  "|---|---|---|" + "---|" * n_max]
        for name, m in costs.items():
            for kind in ("chain", "tree"):
                lines.append(f"| {name} | {m['t1_s'] * 1000:.2f} ms | {kind} | "
                             + " | ".join(f"{v:.2f}" for v in m[f"verify_{kind}"]) + " |")
        lines += ["", "Tree: the root and a binary tree of n - 1 nodes in breadth-first order under the loop's tree "
                  "attention mask (`hf_spec.tuning.measure_forward_times`); the prediction below uses the chain costs.", ""]
        lines += ["## Predicted speedup (GPU costs, CPU acceptance)", "",
                  "| target | method | acceptance by position (CPU, conditional) | c (GPU) | T_verify(k+1)/T_1 (GPU) | "
                  "predicted speedup by k (GPU) | best k | CPU: c, T_verify(4)/T_1, measured decode speedup at k=3 |",
                  "|---|---|---|---|---|---|---|---|"]
        for name, methods in result["prediction"].items():
            for method, p in methods.items():
                acc = result["acceptance"][method]
                ks = list(p["predicted"])
                verify = " / ".join(f"{costs[name]['verify_chain'][k]:.2f}" for k in ks)
                cpu = ("-" if acc["cpu_cost_ratio"] is None else
                       f"{acc['cpu_cost_ratio']:.3f}, {acc['cpu_verify_cost']:.2f}, {acc['cpu_speedup_decode']:.2f}x")
                lines.append(f"| {name} | {method} | {' / '.join(f'{a:.2f}' for a in acc['conditional_acceptance'])} | "
                             f"{p['c']:.4f} | {verify} | {' / '.join(f'{v:.2f}x' for v in p['predicted'].values())} | "
                             f"{p['best_k']} | {cpu} |")
        lines += ["", "predicted = E[tokens per step] / (T_verify(k+1)/T_1 + k c) (`hf_spec.tuning.expected_speedup`), "
                  "for the k whose acceptance the CPU runs measured. Acceptance: the Qwen2.5-Coder-1.5B target's "
                  "(greedy, Spec-Bench), also for the 7B target, whose own acceptance was not measured. Sources: "
                  + "; ".join(f"{m}: `{a['source']}`" for m, a in result["acceptance"].items()) + ".", ""]
    lines += [f"AWQ-INT4: {'measured' if result['awq']['measured'] else 'skipped: ' + result['awq']['reason']}", ""]
    if result["conformance"]:
        lines += [f"## Conformance matrix on {result['settings']['device']} (`tests/test_conformance.py`)", "", "| dtype | result | seconds |", "|---|---|---|"]
        for dtype, c in result["conformance"].items():
            res = (", ".join(f"{n} {k}" for k, n in c["counts"].items() if n) or (
                "none finished" if c["timed_out"] else f"exit {c['returncode']}")) + f" of {c['tests']}" + (
                " (stopped at the time limit)" if c["timed_out"] else "")
            lines.append(f"| {dtype} | {res} | {c['seconds']:.0f} |")
            lines += [f"| | {f} | |" for f in c["failed"][:10]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="gpu-check", help="folder for results.json and results.md (default gpu-check)")
    p.add_argument("--device", default="cuda", help="cuda (default) or cuda:N; cpu to try the script here")
    p.add_argument("--tiny", action="store_true", help="small configs instead of the real ones (a smoke run)")
    p.add_argument("--targets", default=",".join(PAIRS), help=f"comma-separated, of {', '.join(PAIRS)} (default: both)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--context", type=int, default=256, help="tokens in the cache before each measured forward")
    p.add_argument("--n-max", type=int, default=16, help="verify positions n = 1..N (default 16)")
    p.add_argument("--repeats", type=int, default=10, help="timed forwards per point (median; default 10)")
    p.add_argument("--conformance", default=None,
                   help="dtypes for the conformance run, comma-separated (default on CUDA: bfloat16,float32; "
                        "'none' skips it; on a CPU it is skipped unless named)")
    p.add_argument("--jobs", type=int, default=4, help="pytest processes per conformance dtype (default 4)")
    p.add_argument("--budget", type=float, default=470.0,
                   help="seconds for the whole run (default 470, under 8 minutes): the conformance runs get "
                        "what the measurements leave, and report what they finished")
    args = p.parse_args(argv)
    unknown = set(args.targets.split(",")) - set(PAIRS)
    if unknown:
        p.error(f"unknown --targets {', '.join(sorted(unknown))}; use {', '.join(PAIRS)}")
    if args.n_max < 2 or args.repeats < 1 or args.context < 1:
        p.error("need --n-max >= 2, --repeats >= 1 and --context >= 1")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here (torch.cuda.is_available() is False); nothing measured. "
              "Run it on a GPU machine, or try it with --device cpu --tiny")
        return 0
    if device.type == "cpu" and not args.tiny:
        print("gpu_check: --device cpu builds the real configs (the 7B needs ~16 GB and minutes); add --tiny for a smoke run",
              file=sys.stderr)
    from hf_spec.device import machine_info

    log = lambda msg: print(f"gpu_check: {msg}", flush=True)  # noqa: E731
    t0 = time.perf_counter()
    machine = dict(machine_info(), device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu")
    from transformers import Qwen2ForCausalLM

    from hf_spec.ragged import cache_kwarg

    log(f"{machine['device']}, torch {machine['torch']}, transformers {machine['transformers']} (a model's forward "
        f"takes its cache as {cache_kwarg(Qwen2ForCausalLM)}=)")
    torch.manual_seed(0)
    costs = measure(args, device, log)
    acceptance = cpu_acceptance()
    prediction = predict(costs, acceptance)
    awq = awq_check(log)
    names = args.conformance or ("bfloat16,float32" if device.type == "cuda" else "none")
    dtypes = [] if names == "none" else [d.strip() for d in names.split(",") if d.strip()]
    conf = conformance(dtypes, args.device, args.jobs, t0 + args.budget - 10, log) if dtypes else {}
    settings = {k: getattr(args, k) for k in ("device", "tiny", "dtype", "context", "n_max", "repeats", "targets")}
    result = {"machine": machine, "settings": settings, "configs": {n: {**COMMON, **(TINY if args.tiny else CONFIGS)[n]} for n in CONFIGS},
              "costs": costs, "acceptance": acceptance, "prediction": prediction, "awq": awq, "conformance": conf,
              "seconds": time.perf_counter() - t0}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    md = markdown(result)
    (out / "results.md").write_text(md)
    print(md)
    log(f"written: {out}/results.json, results.md ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
