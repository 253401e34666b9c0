"""The conformance matrix (tests/conformance.py): every architecture x drafter x batch cell greedy
token-identical to the target's own ``generate`` at k = 1, 3 and auto and with a shipped instruct config's
repetition penalty, or refused with a reason; the table in docs/conformance.md says the same; and sampling with
a shipped instruct config's processors distribution-exact (chi-square) on a subset of architectures, in a batch.

Runs on CPU in float32 by default; ``HF_SPEC_TEST_DEVICE`` / ``HF_SPEC_TEST_DTYPE`` move it (scripts/gpu_check.py)."""

import re
from pathlib import Path

import pytest
import torch

import hf_spec
import hf_spec.acceptance
import hf_spec.ragged

from . import conformance as C
from .test_acceptance import wrong_residual
from .test_sampling_exact import ALPHA, pvalue

TABLE = Path(__file__).resolve().parent.parent / "docs" / "conformance.md"


@pytest.fixture(autouse=True)
def no_window_slack(monkeypatch):
    """Sliding-window layers drop every slot no query reads again (no slack past the window, hf_spec.ragged), so the
    short calls of the matrix roll back, branch and batch across dropped slots on every sliding-window architecture."""
    monkeypatch.setattr(hf_spec.ragged, "WINDOW_SLACK", 0)


def documented_verdicts() -> dict[str, list[str]]:
    """{architecture: [verdict word per drafter x batch column]} from the table in docs/conformance.md."""
    rows = {}
    for line in TABLE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 + 2 * len(C.DRAFTERS) and cells[0] in {a.name for a in C.ARCHITECTURES}:
            rows[cells[0]] = [re.match(r"\w+", c).group(0) if c else "" for c in cells[2:]]
    return rows


def table_columns() -> list[tuple[str, str]]:
    """The cells of a row of the table, in its column order: drafter x batch, then the tree column."""
    return [(kind, batch) for kind in C.DRAFTERS for batch in C.BATCHES] + [(C.TREE_COLUMN, "all")]


@pytest.mark.parametrize("arch", C.ARCHITECTURES, ids=lambda a: a.name)
def test_every_cell_is_exact_or_refused_and_documented(arch):
    cells = C.run_architecture(arch)
    for (kind, batch), cell in cells.items():
        if refusal := arch.refused(batch, kind):  # refused before any work, saying why
            assert cell.verdict.startswith("refused") and refusal in cell.verdict, (kind, batch, cell.verdict)
        else:
            assert cell.verdict.startswith("exact"), f"{arch.name}, {kind}, {batch}: {cell.verdict}"
    # the test's power: the draft model (and the trees) were both accepted and rejected where they ran
    draft = [c for (kind, batch), c in cells.items() if kind in ("draft model", C.TREE_COLUMN)
             and not arch.refused(batch, kind)]
    assert all(0 < c.acceptance < 1 for c in draft), [c.acceptance for c in draft]
    if C.DEVICE.type == "cpu" and C.DTYPE == torch.float32:  # the documented table is the CPU float32 run's
        words = [cells[key].verdict.split(":")[0].split(" (")[0] for key in table_columns()]
        assert documented_verdicts().get(arch.name) == words, \
            f"docs/conformance.md is stale for {arch.name}: run scripts/conformance_table.py"


SAMPLING_SUBSET = [a for a in C.ARCHITECTURES if a.name in ("Gemma 3", "GPT-2", "Mixtral (MoE)")]
SAMPLING_RUNS = 3000


@pytest.fixture(scope="module", params=SAMPLING_SUBSET, ids=lambda a: a.name)
def sampling_pair(request):
    """Target and a draft that disagrees with it enough for a wrong rule to show."""
    arch = request.param
    return arch, C.build(arch), C.build(arch, noise=0.05)


@pytest.mark.parametrize("kind", ["draft model", "ngram"])
def test_sampling_with_an_instruct_config_is_distribution_exact(sampling_pair, kind):
    arch, target, draft = sampling_pair
    exact = C.exact_distribution(target)
    assert abs(sum(exact.values()) - 1) < 1e-4
    counts = C.sampled_counts(target, C.make_drafter(kind, target, draft, 2), SAMPLING_RUNS)
    assert pvalue(counts, exact) > ALPHA, (arch.name, kind)


def test_the_sampling_test_fails_for_a_wrong_rule(monkeypatch):
    arch = SAMPLING_SUBSET[0]
    target, draft = C.build(arch), C.build(arch, noise=0.05)
    exact = C.exact_distribution(target)
    monkeypatch.setattr(hf_spec.acceptance, "_residual", wrong_residual)
    counts = C.sampled_counts(target, C.make_drafter("draft model", target, draft, 2), SAMPLING_RUNS, seed=1)
    assert pvalue(counts, exact) < ALPHA


def test_hybrid_sampling_in_a_batch_is_distribution_exact(monkeypatch):
    """The hybrid drafter in a batch under an instruct config's sampling: rows take suffix drafts (one-hot q) or
    the draft model's (sampled q) in the same step, and every row keeps the target's distribution."""
    # the 3 tokens of this test cannot repay the draft model's prompt prefill, so the hybrid drafter would rightly
    # leave the model out (rows without a suffix match draft nothing): price the prefill at 0 to get both sources
    monkeypatch.setattr(hf_spec.DraftModelDrafter, "catch_up_cost", lambda self, sequences: 0.0)
    # and rate every suffix match as a long one (random tokens match 1-2 tokens, whose measured prior loses to an
    # unmeasured model): rows with a match take the suffix, rows without the model
    monkeypatch.setattr(hf_spec.drafters.hybrid, "SUFFIX_PRIORS", ((1, 0.9, 0.9),))
    arch = SAMPLING_SUBSET[0]
    target, draft = C.build(arch), C.build(arch, noise=0.05)
    exact = C.exact_distribution(target)
    sources = []
    drafter = C.make_drafter("hybrid", target, draft, 2)
    start = drafter.start

    def recording_start(*args, **kwargs):  # see each step's per-row sources
        session = start(*args, **kwargs)
        draft_step = session.draft

        def draft_and_record(sequences, k):
            out = draft_step(sequences, k)
            sources.append(list(session.last_sources))
            return out
        session.draft = draft_and_record
        return session

    drafter.start = recording_start
    counts = C.sampled_counts(target, drafter, SAMPLING_RUNS, seed=2)
    assert pvalue(counts, exact) > ALPHA
    assert any("suffix" in step and "draft" in step for step in sources)  # both kinds of rows in one step
