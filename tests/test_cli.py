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
