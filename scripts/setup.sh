#!/usr/bin/env bash
# Set up hf-spec in ./.venv: torch (the CPU build, pinned, on machines without a CUDA GPU), hf-spec with
# its offline extra (gguf, to provision the offline models) and its test extras, and the small real model the
# tests use. Idempotent; safe to run again.
#   EXTRAS=test,bench  bash scripts/setup.sh     # extras to install besides offline (default: test)
#   TORCH_SPEC="torch==2.13.0"                    # override the torch requirement
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
PIP=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
if [ -z "${TORCH_SPEC:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    TORCH_SPEC="torch>=2.4"        # a CUDA machine: the default (CUDA) build
  else
    TORCH_SPEC="torch==2.13.0"     # no CUDA: pin the CPU build (a plain 'torch' pulls a multi-GB CUDA build)
  fi
fi
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  echo "setup: installing $TORCH_SPEC" >&2
  "${PIP[@]}" "$TORCH_SPEC"
fi
echo "setup: installing hf-spec[offline,${EXTRAS:-test}]" >&2
"${PIP[@]}" -e ".[offline,${EXTRAS:-test}]"
echo "setup: provisioning the test model (smollm2-135m)" >&2
# its path to stderr with the other set-up lines: stdout stays the main job's (README: setup.sh && hf-spec generate)
smol=$(.venv/bin/hf-spec provision smollm2-135m)
echo "setup: smollm2-135m is in $smol" >&2
echo "setup: done. Activate with: source .venv/bin/activate" >&2
