"""Every code block of the README and the user guide runs.

Python blocks run in order in one namespace per file; bash blocks' ``hf-spec`` commands run through the CLI.
Both with small settings so that CI stays short: the Qwen2.5-Coder models become SmolLM2-135M, generation
lengths 8 tokens, a benchmark 1 prompt of 2 categories, a metrics port any free one. ``bash scripts/setup.sh``
and the pytest commands are what ``.ci/run`` itself runs (the fast lane is a subset of it);
``source .venv/bin/activate`` changes no state a test could check.
"""

import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = ["README.md", "docs/user-guide.md"]
RUN_BY_CI = {"bash scripts/setup.sh", ".venv/bin/python -m pytest -q tests", "source .venv/bin/activate",
             "EXTRAS=test,bench bash scripts/setup.sh",
             '.venv/bin/python -m pytest -q -m "not slow" tests'}  # the fast lane: a subset of what CI runs

pytestmark = pytest.mark.slow


def blocks(path: str, lang: str) -> list[str]:
    text = (ROOT / path).read_text()
    return [textwrap.dedent(m.group(1)) for m in re.finditer(rf"```{lang}\n(.*?)```", text, re.S)]


def small(code: str) -> str:
    code = re.sub(r"qwen2\.5-coder-(1\.5b|0\.5b)", "smollm2-135m", code)
    code = re.sub(r"max_new_tokens=\d+", "max_new_tokens=8", code)
    code = re.sub(r"--max-new-tokens \d+", "--max-new-tokens 8", code)
    code = re.sub(r"--per-category \d+", "--per-category 1", code)
    return code.replace("serve(9400)", "serve(0)")


PREAMBLE = {  # what the user guide's fragments assume is already there
    "docs/user-guide.md": textwrap.dedent("""
        import hf_spec
        from hf_spec.prompts import chat_inputs
        target, tokenizer = hf_spec.load("smollm2-135m")
        model = target
        inputs = chat_inputs(tokenizer, "Write a Python function that reverses a string.")
        drafter = hf_spec.DraftModelDrafter(hf_spec.load("smollm2-135m")[0], 3)
    """),
}


@pytest.mark.parametrize("path", FILES)
def test_python_blocks_run(path):
    code = blocks(path, "python")
    assert code, f"no python blocks in {path}"
    namespace: dict = {}
    exec(compile(PREAMBLE.get(path, ""), f"{path}:preamble", "exec"), namespace)
    for i, block in enumerate(code):
        exec(compile(small(block), f"{path}:python block {i}", "exec"), namespace)


def commands(path: str) -> list[str]:
    out = []
    for block in blocks(path, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line:
                out.append(line)
    return out


@pytest.mark.parametrize("path", FILES)
def test_shell_commands_run(path, tmp_path):
    for line in commands(path):
        for part in [p.strip() for p in line.split("&&")]:
            if part in RUN_BY_CI:
                continue
            argv = shlex.split(small(part))
            assert argv[0] in ("hf-spec", ".venv/bin/hf-spec"), f"{path}: a command no test runs: {part}"
            argv = [sys.executable, "-m", "hf_spec.cli"] + argv[1:]
            if "--out" in argv:
                argv[argv.index("--out") + 1] = str(tmp_path / "out")
            if argv[3] == "bench" and "--categories" not in argv:
                argv += ["--categories", "coding,qa"]
            r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=1200)
            assert r.returncode == 0, f"{part}\n{r.stderr[-3000:]}"
