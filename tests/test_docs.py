"""The documentation site builds with warnings as errors (MkDocs + mkdocstrings: the API reference is
generated from the docstrings, so a broken docstring or link fails here)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_docs_site_builds_strict(tmp_path):
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                       cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert r.returncode == 0, r.stderr[-4000:]
    html = (tmp_path / "site" / "api" / "index.html").read_text()
    for name in ("speculative_decode", "greedy_accept", "AdaptiveK", "PrometheusMetrics", "DraftModelDrafter"):
        assert name in html, name
