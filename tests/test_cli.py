"""The hf-spec command, end to end on the real SmolLM2 (small settings)."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def run(*args):
    return subprocess.run([sys.executable, "-m", "hf_spec.cli", *args], capture_output=True, text=True, timeout=600)


def test_generate_compare_json():
    r = run("generate", "--target", "smollm2-135m", "--drafter", "ngram", "-k", "3", "--max-new-tokens", "24",
            "--prompt", "Write a Python function that reverses a string.", "--chat", "--compare", "--json",
            "--dtype", "float32")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    for key in ("text", "new_tokens", "acceptance_rate", "mean_accepted_length", "tokens_per_s", "ttft_s", "tpot_s",
                "baseline_tokens_per_s", "speedup", "identical_to_baseline"):
        assert key in out, key
    assert out["new_tokens"] == 24 and out["identical_to_baseline"] is True
    assert out["speedup"] == pytest.approx(out["tokens_per_s"] / out["baseline_tokens_per_s"])


def test_generate_prompt_file_jsonl(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "Say hi."}\n{"turns": ["Count to five."]}\n')
    r = run("generate", "--target", "smollm2-135m", "--drafter", "none", "--max-new-tokens", "8", "--prompt-file",
            str(f), "--chat", "--json", "--dtype", "float32")
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(json.loads(r.stdout)["rows"]) == 2


def test_generate_batches_compare_json(tmp_path):
    """--batch-size 3 over 4 prompts (batches of 3 and 1), one answer ending early on EOS."""
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "Say hello."}\n{"turns": ["Write a Python function that reverses a string."]}\n'
                 '{"prompt": "List three colors."}\n{"prompt": "What is 2 + 2? Answer with a number only."}\n')
    r = run("generate", "--target", "smollm2-135m", "--drafter", "ngram", "-k", "3", "--max-new-tokens", "24",
            "--prompt-file", str(f), "--chat", "--batch-size", "3", "--compare", "--json", "--dtype", "float32")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["config"]["batch_size"] == 3 and len(out["rows"]) == 4
    for row in out["rows"]:
        assert row["identical_to_baseline"] is True
        assert 0 < row["new_tokens"] <= 24 and 0.0 <= row["acceptance_rate"] <= 1.0
    assert min(row["new_tokens"] for row in out["rows"]) < 24  # a row ended on EOS
    assert out["speedup"] == pytest.approx(out["tokens_per_s"] / out["baseline_tokens_per_s"])


@pytest.mark.parametrize("args,msg", [
    (["--batch-size", "0"], "--batch-size must be >= 1"),
    (["--temperature", "-1"], "--temperature must be >= 0"),
    (["-k", "0"], "-k must be >= 1"),
    (["--prompt", "  "], "empty prompt"),
    (["--drafter", "medusa-ish"], "unknown drafter"),
    (["--target", "no-such-model"], "unknown model"),
])
def test_bad_input_gives_clear_errors(args, msg):
    base = {"--target": "smollm2-135m", "--prompt": "hi", "--drafter": "ngram"}
    argv = ["generate"]
    for flag, val in base.items():
        if flag not in args:
            argv += [flag, val]
    r = run(*argv, *args, "--max-new-tokens", "4")
    assert r.returncode != 0
    assert msg in r.stderr
    assert "Traceback" not in r.stderr


def test_train_medusa_on_a_text_file(tmp_path):
    """Tiny settings on real SmolLM2: heads saved in vLLM's Medusa layout, a report, and a rerun of the
    same command resumes from the finished checkpoint and cached features (same heads)."""
    from safetensors.torch import load_file

    data = tmp_path / "corpus.txt"
    data.write_text("\n\n".join(
        f"def add_{i}(a, b):\n    \"\"\"Return a + b + {i}.\"\"\"\n    return a + b + {i}\n" for i in range(12)))
    out = tmp_path / "heads"
    argv = ("train-medusa", "--target", "smollm2-135m", "--data", str(data), "--heads", "2", "--epochs", "1",
            "--batch-size", "16", "--out", str(out))
    r = run(*argv)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert report["kind"] == "text" and len(report["agreement"]) == 2 and report["positions"] > 100
    assert "| head | predicts | top-1 agreement |" in r.stdout
    cfg = json.loads((out / "config.json").read_text())  # vLLM's layout (tests/test_medusa_vllm.py)
    assert cfg["model_type"] == "medusa" and cfg["num_heads"] == 2 and cfg["hf_spec_variant"] == "shared-lm-head"
    assert cfg["original_lm_head"] is True and cfg["medusa_fc_bias"] is True
    first = load_file(str(out / "model.safetensors"))
    assert set(first) == {f"blocks.{i}.layers.0.{w}" for i in range(2) for w in ("weight", "bias")} | {"lm_heads.0.weight"}
    assert first["lm_heads.0.weight"].shape == (49152, 576)  # the target's lm_head, which vLLM's draft needs
    r = run(*argv)
    assert r.returncode == 0, r.stderr[-2000:]
    again = json.loads((out / "report.json").read_text())
    assert again["feature_seconds"] == 0.0 and again["resumed_from_step"] == again["steps"]
    second = load_file(str(out / "model.safetensors"))
    assert all(first[k].equal(second[k]) for k in first)


@pytest.mark.parametrize("args,msg", [
    (["--heads", "0"], "--heads must be >= 1"),
    (["--data", "/no/such/file.txt"], "no such data file"),
    (["--holdout-fraction", "1.5"], "--holdout-fraction must be in (0, 1)"),
])
def test_train_medusa_bad_input(tmp_path, args, msg):
    r = run("train-medusa", "--target", "smollm2-135m", "--out", str(tmp_path / "o"), *args)
    assert r.returncode != 0 and msg in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists()


def test_generate_with_medusa_heads():
    r = run("generate", "--target", "smollm2-135m", "--drafter", "medusa:smollm2-135m", "-k", "2",
            "--max-new-tokens", "16", "--prompt", "Write a Python function that reverses a string.", "--chat",
            "--compare", "--json", "--dtype", "float32")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["identical_to_baseline"] is True
    r = run("generate", "--target", "smollm2-135m", "--drafter", "medusa:smollm2-135m", "-k", "5",
            "--max-new-tokens", "4", "--prompt", "hi")
    assert r.returncode == 2 and "4 heads" in r.stderr and "Traceback" not in r.stderr


def test_generate_auto_k_json_and_prometheus_scrape():
    """-k auto: identical output, the k of every step and the policy's decisions in the JSON; the metrics
    served on loopback during --prometheus-hold equal the statistics."""
    import socket
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "hf_spec.cli", "generate", "--target", "smollm2-135m", "--drafter", "ngram", "-k", "auto",
           "--max-new-tokens", "40", "--prompt", "Write a Python function that reverses a string.", "--chat",
           "--compare", "--json", "--dtype", "float32", "--prometheus-port", str(port), "--prometheus-hold", "120"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in proc.stdout:  # the JSON is printed (and flushed) before the hold
            lines.append(line)
            if line.rstrip() == "}":
                break
        out = json.loads("".join(lines))
        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        proc.kill()
        proc.communicate()
    assert out["identical_to_baseline"] is True and out["config"]["num_speculative_tokens"] == "auto"
    assert len(out["k_per_step"]) == out["target_forwards"] - 1 and out["k_per_step"][0] == 0
    assert out["policy_events"][0]["mode"] == "measure" and all(e["reason"] for e in out["policy_events"])
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for fam in text_string_to_metric_families(page) for s in fam.samples}
    lab = (("method", "ngram"),)
    assert got[("hf_spec:spec_decode_num_emitted_tokens_total", lab)] == out["new_tokens"]
    assert got[("hf_spec:spec_decode_draft_acceptance_rate", lab)] == pytest.approx(out["acceptance_rate"])


def test_generate_bad_auto_and_port():
    for args, msg in [(["-k", "fast"], "integer >= 1 or auto"), (["--prometheus-port", "70000"], "TCP port"),
                      (["--prometheus-hold", "-1"], "--prometheus-hold")]:
        r = run("generate", "--target", "smollm2-135m", "--prompt", "hi", *args)
        assert r.returncode != 0 and msg in r.stderr and "Traceback" not in r.stderr, (args, r.stderr[-500:])


@pytest.mark.parametrize("args,msg", [
    ([], "group size 128 does not divide {'hidden_size': 576}; use --group-size 64"),
    (["--group-size", "64", "--calibration", "/no/such/texts.txt"], "no calibration file /no/such/texts.txt"),
    (["--group-size", "64", "--num-texts", "2"], "gives 2 calibration texts; AWQ needs at least 8"),
    (["--group-size", "0"], "need group_size >= 1"),
    (["--target", "no-such-model"], "neither an offline model name nor a model folder"),
])
def test_quantize_bad_input(tmp_path, args, msg):
    argv = ["quantize", "--out", str(tmp_path / "awq")] + (["--target", "smollm2-135m"] if "--target" not in args else [])
    r = run(*argv, *args)
    assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_generate_with_an_nf4_target():
    r = run("generate", "--target", "smollm2-135m", "--quantization", "nf4", "--drafter", "ngram", "-k", "3",
            "--max-new-tokens", "16", "--prompt", "Write a Python function that reverses a string.", "--chat",
            "--compare", "--json", "--dtype", "float32")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["config"]["quantization"] == "nf4" and out["identical_to_baseline"] is True


def test_first_difference_names_the_position_tokens_and_logits(smol):
    """--compare's explanation of a differing output: the first differing new token, both tokens, and the
    target's logits for them after the common prefix (checked against a forward of its own)."""
    import torch

    from hf_spec.commands.generate import first_difference

    model, tok = smol
    prompt = torch.tensor(tok("def reverse(s):")["input_ids"])
    plain = model.generate(prompt[None], attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                           max_new_tokens=8, do_sample=False)[0, len(prompt):]
    assert first_difference(model, tok, prompt, plain, plain) is None
    assert first_difference(model, tok, prompt, plain, plain[:5]) is None  # a prefix: no difference
    other = plain.clone()
    other[5] = (int(plain[5]) + 1) % model.config.vocab_size
    diff = first_difference(model, tok, prompt, plain, other)
    with torch.no_grad():
        logits = model(torch.cat([prompt, plain[:5]])[None]).logits[0, -1].float()
    assert diff["new_token"] == 5
    assert diff["plain"] == tok.decode([int(plain[5])]) and diff["speculative"] == tok.decode([int(other[5])])
    assert diff["plain_logit"] == pytest.approx(float(logits[plain[5]]), abs=1e-4)
    assert diff["logit_gap"] == pytest.approx(float(logits[plain[5]] - logits[other[5]]), abs=1e-4)
    assert diff["logit_gap"] > 0  # greedy chose the plain token: it has the top logit
    # a swapped token is no near-tie in float32 unless its logit is within NEAR_TIE_BOUNDS["float32"]
    from hf_spec.commands.generate import near_tie_verdict as _near_tie_verdict

    assert "not a near-tie" in _near_tie_verdict(0.2, model, torch.float32)
    assert _near_tie_verdict(1e-4, model, torch.float32).startswith("a near-tie")
    assert _near_tie_verdict(0.2, model, torch.bfloat16).startswith("a near-tie")
    assert "no measured rounding bound" in _near_tie_verdict(0.2, model, torch.float16)
