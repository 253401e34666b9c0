"""Devices without a GPU: --device-map on the commands, --dtype auto per device, the CUDA-synchronised clock,
the CPU-only kernels' device guards, and scripts/gpu_check.py's no-CUDA exit and CPU smoke run."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hf_spec.device as dev
from hf_spec import kernels
from hf_spec.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")


@pytest.mark.parametrize("command", ["generate", "bench", "tune"])
def test_help_lists_device_map(command, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args([command, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--device-map" in out and "auto when CUDA" in " ".join(out.split())


def test_demo_help_lists_device_map(capsys):
    from hf_spec.demo import main as demo_main

    with pytest.raises(SystemExit) as e:
        demo_main(["--help"])
    assert e.value.code == 0 and "--device-map" in capsys.readouterr().out


def test_provision_help_lists_every_offline_model(capsys):
    from hf_spec.models import MODELS

    with pytest.raises(SystemExit):
        build_parser().parse_args(["provision", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "gemma-3-270m" in MODELS
    for name in MODELS:
        assert name in out


@no_cuda
@pytest.mark.parametrize("argv,msg", [
    (["generate", "--target", "smollm2-135m", "--prompt", "hi", "--device-map", "gpu"], "--device-map 'gpu': use auto"),
    (["generate", "--target", "smollm2-135m", "--prompt", "hi", "--device-map", "cuda"], "no CUDA device here"),
    (["tune", "--target", "smollm2-135m", "--drafter", "ngram", "--device-map", "cuda:1"], "no CUDA device here"),
    (["bench", "--target", "smollm2-135m", "--out", "unused", "--device-map", "tpu"], "--device-map 'tpu'"),
])
def test_bad_device_map_is_one_line_exit_2(argv, msg, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("hf-spec: error: ") and msg in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []  # nothing loaded, nothing written


@no_cuda
def test_demo_bad_device_map_is_one_line_exit_2(capsys):
    from hf_spec.demo import main as demo_main

    assert demo_main(["--target", "smollm2-135m", "--draft", "", "--device-map", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hf-spec: error: --device-map cuda: no CUDA device here") and err.count("\n") == 1


def test_default_device_map_follows_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert dev.resolve_device_map(None) == "auto"
    assert dev.main_device("auto") == torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert dev.resolve_device_map(None) == "cpu"
    assert dev.main_device("auto") == torch.device("cpu")
    for value in ("auto", "balanced", "sequential", "cpu", " CPU "):
        assert dev.resolve_device_map(value) == value.strip().lower()


def test_main_device_of_device_maps():
    assert dev.main_device({"model.embed_tokens": 0, "lm_head": "cpu"}) == torch.device("cuda", 0)
    assert dev.main_device({"": "cuda:1"}) == torch.device("cuda", 1)
    assert dev.main_device({"": "cpu", "x": "disk"}) == torch.device("cpu")
    assert dev.main_device("cuda:2") == torch.device("cuda", 2)


def test_auto_dtype_decides_per_device():
    bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
    assert dev.auto_dtype("cuda", capability=(9, 0)) == bf16  # H100/H200
    assert dev.auto_dtype("cuda:1", capability=(8, 0)) == bf16  # A100
    assert dev.auto_dtype(torch.device("cuda", 0), capability=(7, 5)) == fp16  # T4: no native bfloat16
    assert dev.auto_dtype("cpu", cpu_bf16=True) == bf16
    assert dev.auto_dtype("cpu", cpu_bf16=False) == fp32
    assert dev.auto_dtype("mps") == fp32
    assert dev.auto_dtype("cpu") == (bf16 if dev.cpu_has_native_bf16() else fp32)


def test_resolve_dtype_asks_the_device_the_model_goes_to(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))
    assert dev.resolve_dtype("auto", "auto") == torch.float16  # --device-map auto on a V100
    assert dev.resolve_dtype("auto", "cuda:0") == torch.float16
    assert dev.resolve_dtype("auto", "cpu") == dev.auto_dtype("cpu")  # --device-map cpu on a GPU machine: the CPU's
    assert dev.resolve_dtype("float32", "cuda") == torch.float32
    with pytest.raises(ValueError, match="unknown dtype"):
        dev.resolve_dtype("int8", "cpu")


def test_synchronize_waits_on_cuda_only(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    dev.synchronize("cpu")
    dev.synchronize(None)
    dev.synchronize(torch.zeros(1))  # a CPU tensor
    assert calls == []
    dev.synchronize("cuda:0")  # every visible GPU: a sharded model computes on several
    assert calls == [0, 1]
    t = dev.clock(torch.device("cuda", 1))
    assert calls == [0, 1, 0, 1] and isinstance(t, float)
    assert dev.clock("cpu") >= t


def test_verify_linear_never_engages_off_the_cpu(monkeypatch):
    """The (W @ x.T).T path is for float32 CPU inputs only: a non-CPU tensor (meta stands in for CUDA) takes
    F.linear even inside verify_linear on a routed layer (the CPU's form measured faster here)."""
    monkeypatch.setattr(kernels, "time_form", lambda name, fn: {"linear": 2.0, "mm": 1.0}[name])
    monkeypatch.setattr(kernels, "_MEASURED", {})
    calls = []
    real_mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda *a: calls.append("mm") or real_mm(*a))
    for device, expected in (("meta", []), ("cpu", ["mm"])):
        calls.clear()
        layer = torch.nn.Linear(1024, 1024, bias=False, device=device)
        assert kernels.install_verify_linear(layer) == 1
        with kernels.verify_linear():
            y = layer(torch.zeros(3, 1024, device=device))
        assert calls == expected and y.device.type == device and y.shape == (3, 1024)


def test_upcast_prefill_never_engages_off_the_cpu(monkeypatch):
    seen = []
    real_linear = kernels.F.linear
    monkeypatch.setattr(kernels.F, "linear", lambda x, w, b=None: seen.append(x.dtype) or real_linear(x, w, b))
    for device, expected in (("meta", torch.bfloat16), ("cpu", torch.float32)):
        seen.clear()
        layer = torch.nn.Linear(64, 64, dtype=torch.bfloat16, device=device)
        kernels.install_upcast_prefill(layer)
        with kernels.upcast_prefill():
            y = layer(torch.zeros(64, 64, dtype=torch.bfloat16, device=device))  # 64 rows: a prefill
        assert seen == [expected] and y.dtype == torch.bfloat16


def test_load_maps_cpu_to_from_pretrained_default(monkeypatch, tmp_path):
    """--device-map cpu loads as before (no accelerate dispatch); other maps pass through."""
    import transformers

    from hf_spec import models

    seen = []

    class Fake:
        def eval(self):
            return self

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda path, **kw: seen.append(kw["device_map"]) or Fake())
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda path: None)
    for name in ("config.json", "tokenizer.json"):  # what load checks a local folder for
        (tmp_path / name).write_text("{}")
    for device_map in ("cpu", torch.device("cpu"), None, "auto", "cuda:0"):
        models.load(str(tmp_path), device_map=device_map)
    assert seen == [None, None, None, "auto", "cuda:0"]


def test_forward_times_are_measured_on_the_loops_forwards(monkeypatch):
    """measure_forward_times runs RaggedCache.forward, the loop's own forward (its masks, its attention path): a
    chain of n positions, or the root and a binary tree of n - 1 nodes under it, each rolled back after its run."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from hf_spec.ragged import RaggedCache
    from hf_spec.tuning import measure_forward_times

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=100)).eval()
    context = torch.randint(0, 100, (1, 9))
    calls = []
    forward = RaggedCache.forward

    def spy(self, model, block, *args, parents=None, **kwargs):
        calls.append((self.lengths.tolist(), block.shape[1], None if parents is None else parents.tolist()))
        return forward(self, model, block, *args, parents=parents, **kwargs)

    monkeypatch.setattr(RaggedCache, "forward", spy)
    for tree in (False, True):
        calls.clear()
        assert set(measure_forward_times(model, context, [1, 7], repeats=1, tree=tree)) == {1, 7}
        assert calls[0] == ([0], 9, None)  # the prefill
        assert calls[1:] == [([9], 1, None)] * 2 + [([9], 7, [[-1, -1, 0, 0, 1, 1]] if tree else None)] * 2


def _gpu_check(*args, timeout=120):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


@no_cuda
def test_gpu_check_exits_cleanly_without_cuda():
    r = _gpu_check()
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines() == [
        "gpu_check: no CUDA device here (torch.cuda.is_available() is False); nothing measured. Run it on a GPU "
        "machine, or try it with --device cpu --tiny"]


def test_gpu_check_cpu_smoke_run(tmp_path):
    """The measuring code of scripts/gpu_check.py on small configs on the CPU: verify costs (chain and tree),
    draft costs, the prediction table from the CPU acceptance files, results.json and results.md."""
    r = _gpu_check("--device", "cpu", "--tiny", "--dtype", "float32", "--n-max", "4", "--repeats", "1",
                   "--context", "16", "--out", str(tmp_path))
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    result = json.loads((tmp_path / "results.json").read_text())
    assert set(result["costs"]) == {"qwen2.5-coder-1.5b", "qwen2.5-7b"}
    for m in result["costs"].values():
        assert len(m["verify_chain"]) == len(m["verify_tree"]) == 4 and m["verify_chain"][0] == 1.0
        assert set(m["cost_ratio"]) == {"draft:qwen2.5-coder-0.5b", "ngram", "medusa (hf-spec heads)"}
        assert all(c > 0 for c in m["cost_ratio"].values())
    assert result["acceptance"]["draft:qwen2.5-coder-0.5b"]["conditional_acceptance"][0] == pytest.approx(0.80, abs=0.01)
    assert set(result["prediction"]["qwen2.5-7b"]["ngram"]["predicted"]) == {"1", "2", "3"}
    assert result["awq"]["measured"] is False and result["conformance"] == {}
    md = (tmp_path / "results.md").read_text()
    assert "## Predicted speedup (GPU costs, CPU acceptance)" in md and "| tree |" in md and "| qwen2.5-7b | draft:qwen2.5-coder-0.5b |" in md
