"""Every tutorial notebook in examples/ runs top to bottom (nbclient), with the small settings
(HF_SPEC_NOTEBOOK_SMALL=1: SmolLM2-135M, short outputs) so that CI stays short; the notebooks' own asserts
(identical outputs, statistics identities) run with them."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
NOTEBOOKS = sorted(EXAMPLES.glob("*.ipynb"))


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 6


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, monkeypatch):
    monkeypatch.setenv("HF_SPEC_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    book = nbformat.read(path, as_version=4)
    NotebookClient(book, timeout=1200, startup_timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(EXAMPLES)}}).execute()
    errors = [o for c in book.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
