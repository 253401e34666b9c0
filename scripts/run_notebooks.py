"""Execute the tutorial notebooks in examples/ and save them with their outputs, so GitHub shows what a real
run printed. Each notebook is written only after it ran without an error (to a temporary file, then renamed).

    .venv/bin/python scripts/run_notebooks.py              # small settings (SmolLM2-135M, short outputs)
    .venv/bin/python scripts/run_notebooks.py --full       # the notebooks' defaults (Qwen2.5-Coder-1.5B + 0.5B)
    .venv/bin/python scripts/run_notebooks.py 01_quickstart 06_metrics
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="notebook names without .ipynb (default: all)")
    parser.add_argument("--full", action="store_true", help="the notebooks' default models instead of the small settings")
    args = parser.parse_args(argv)
    paths = [EXAMPLES / f"{n}.ipynb" for n in args.names] or sorted(EXAMPLES.glob("*.ipynb"))
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        parser.error(f"no such notebook: {', '.join(missing)}")
    if not args.full:
        os.environ["HF_SPEC_NOTEBOOK_SMALL"] = "1"
    os.environ.setdefault("MPLBACKEND", "Agg")
    failed = 0
    for path in paths:
        book = nbformat.read(path, as_version=4)
        try:
            NotebookClient(book, timeout=3600, startup_timeout=300, kernel_name="python3",
                           resources={"metadata": {"path": str(EXAMPLES)}}).execute()
        except Exception as e:  # nbclient raises CellExecutionError with the cell's traceback
            print(f"{path.name}: failed, not written\n{e}", file=sys.stderr)
            failed += 1
            continue
        tmp = path.with_suffix(".ipynb.tmp")
        nbformat.write(book, tmp)
        tmp.replace(path)
        print(f"{path.name}: written with outputs")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
