"""The benchmark harness and the tune command on SmolLM2 with tiny settings (mechanics and output shape
only: no timing assertions)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hf_spec.bench import KEYS, markdown_table, parse_methods, write_report
from hf_spec.metrics import SpecStats

ROOT = Path(__file__).resolve().parents[1]


def run(*args):
    return subprocess.run([sys.executable, "-m", "hf_spec.cli", *args], capture_output=True, text=True, timeout=900)


def test_parse_methods():
    ms = parse_methods("baseline,draft:smollm2-135m,ngram,hf-assisted,hf-prompt-lookup", [3])
    assert [m.name for m in ms] == ["baseline", "draft:smollm2-135m", "ngram", "hf-assisted", "hf-prompt-lookup"]
    assert {m.k for m in ms[1:]} == {3} and ms[3].spec == "smollm2-135m"
    assert [m.kind for m in ms] == ["baseline", "hf-spec", "hf-spec", "hf-assisted", "hf-prompt-lookup"]
    sweep = parse_methods("ngram", [1, 2])
    assert [m.name for m in sweep] == ["baseline", "ngram@k=1", "ngram@k=2"]
    for bad, msg in [("hf-assisted", "needs a draft model"), ("foo", "unknown method"), ("", "empty"),
                     ("medusa:", "needs DIR after the colon"), ("draft:", "needs MODEL after the colon"),
                     ("ngram:4", "takes no argument"), ("medusa:/no/such/heads", "no Medusa heads"),
                     ("none", "the baseline"), ("hybrid:suffix", "takes a model drafter"),
                     ("hybrid:draft:", "needs MODEL after the colon"), ("suffix:x", "takes no argument")]:
        with pytest.raises(ValueError, match=msg):
            parse_methods(bad, [3])
    with pytest.raises(ValueError, match="k must be an integer >= 1 or auto"):
        parse_methods("ngram", [0])
    auto = parse_methods("draft:smollm2-135m,hf-prompt-lookup", [3, "auto"])
    assert [m.name for m in auto] == ["baseline", "draft:smollm2-135m@k=3", "draft:smollm2-135m@k=auto",
                                      "hf-prompt-lookup@k=3"]  # transformers' peers have no k=auto
    # transformers' assisted generation at its own defaults: once, whatever the ks, with the draft model's name
    shipped = parse_methods("draft:smollm2-135m,hf-assisted-defaults", [3, "auto"])[-1]
    assert (shipped.name, shipped.kind, shipped.k, shipped.spec) == ("hf-assisted-defaults", "hf-assisted-defaults",
                                                                     20, "smollm2-135m")
    with pytest.raises(ValueError, match="hf-assisted-defaults needs a draft model"):
        parse_methods("ngram,hf-assisted-defaults", [3])
    auto_only = parse_methods("ngram,hf-prompt-lookup", ["auto"])  # the peers have no auto: their default k
    assert [(m.name, m.k) for m in auto_only] == [("baseline", None), ("ngram", "auto"), ("hf-prompt-lookup", 3)]
    mixed = parse_methods("suffix,hybrid:draft:smollm2-135m,hybrid:medusa:smollm2-135m", [None])[1:]
    assert [(m.name, m.spec, m.k) for m in mixed] == [("suffix", "suffix", 3),
                                                      ("hybrid:draft:smollm2-135m", "hybrid:draft:smollm2-135m", 3),
                                                      ("hybrid:medusa:smollm2-135m", "hybrid:medusa:smollm2-135m", 4)]
    trees = parse_methods("draft:smollm2-135m,medusa:smollm2-135m,suffix,ngram,hybrid:draft:smollm2-135m,hf-assisted",
                          [3], trees=[0, 16, "auto"])
    assert [(m.name, m.tree) for m in trees] == [
        ("baseline", 0), ("draft:smollm2-135m", 0), ("draft:smollm2-135m@tree=16", 16),
        ("draft:smollm2-135m@tree=auto", "auto"), ("medusa:smollm2-135m", 0), ("medusa:smollm2-135m@tree=16", 16),
        ("medusa:smollm2-135m@tree=auto", "auto"), ("suffix", 0), ("suffix@tree=16", 16), ("suffix@tree=auto", "auto"),
        ("ngram", 0), ("hybrid:draft:smollm2-135m", 0), ("hybrid:draft:smollm2-135m@tree=16", 16),
        ("hybrid:draft:smollm2-135m@tree=auto", "auto"), ("hf-assisted", 0)]  # ngram and transformers': chains only
    assert [m.name for m in parse_methods("draft:smollm2-135m", [3], trees=[8])] == ["baseline", "draft:smollm2-135m@tree=8"]
    # a method, k or tree size given twice runs once (twice, under one name, its kept median was the slower run)
    assert [m.name for m in parse_methods("ngram,ngram,suffix", [3, 3])] == ["baseline", "ngram", "suffix"]
    assert [m.name for m in parse_methods("ngram", [2, 3, 2])] == ["baseline", "ngram@k=2", "ngram@k=3"]
    assert [m.name for m in parse_methods("suffix", [3], trees=[8, 8])] == ["baseline", "suffix@tree=8"]
    medusa = parse_methods("medusa:smollm2-135m", [2])[1]  # the shipped heads, by name
    assert (medusa.name, medusa.kind, medusa.spec, medusa.k) == ("medusa:smollm2-135m", "hf-spec", "medusa:smollm2-135m", 2)


def test_results_read_back_with_their_tree_methods(tmp_path):
    """load_results (and so scripts/combine_bench.py) parsed the methods without the run's tree sizes and dropped
    every METHOD@tree=N; it also lost --draft, which hf-assisted's draft may come from."""
    from hf_spec.bench import load_results

    config = {"methods": "baseline,draft:smollm2-135m,hf-assisted", "ks": [3], "trees": [0, 16], "draft": None}
    runs = {name: {"new_tokens": 4, "total_s": 1.0, "ttft_s": 0.1, "tpot_s": 0.3, "tokens_per_s": 4.0,
                   "identical": True} for name in ("baseline", "draft:smollm2-135m", "draft:smollm2-135m@tree=16",
                                                   "hf-assisted")}
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"config": config, "prompts": [{"question_id": "1", "category": "coding",
                                                               "prompt_tokens": 9, "runs": runs}]}))
    assert [m.name for m in load_results(path)[2]] == list(runs)
    path.write_text(json.dumps({"config": dict(config, methods="ngram,hf-assisted", draft="smollm2-135m"),
                                "prompts": []}))
    assert [m.spec for m in load_results(path)[2]][-1] == "smollm2-135m"


def test_failed_report_leaves_nothing(tmp_path, monkeypatch):
    """All or nothing, and nothing written beside --out: the report was staged in --out's parent, so a writable
    --out under a read-only folder (which check_out_folder accepts) failed after the whole run, at every resume."""
    import tempfile

    out = tmp_path / "out"
    with pytest.raises(Exception):
        write_report(out, {"target": "x"}, {"baseline": {}}, {"prompts": []})  # incomplete config and summary
    assert not out.exists() and list(tmp_path.iterdir()) == []
    staged, mkdtemp = [], tempfile.mkdtemp
    monkeypatch.setattr(tempfile, "mkdtemp", lambda **kw: staged.append(kw["dir"]) or mkdtemp(**kw))
    with pytest.raises(Exception):
        write_report(out, {"target": "x"}, {"baseline": {}}, {"prompts": []})
    assert staged == [out]


def test_a_speedup_that_tokens_per_forward_cannot_explain_is_flagged(tmp_path):
    """A new user's bench beside a test suite: plain decoding slowed to 726 ms a step, prompt lookup at 18.98x with
    1.2 tokens per target forward. The report and the command say the baseline was slowed; a plausible run (2x at
    3.2 tokens a forward, and a method without a count) gets no warning."""
    from hf_spec.bench import timing_warnings, write_report

    def method(speedup, tokens):
        return dict(speedup_median=speedup, speedup_total=speedup * 0.9, tokens_per_s=1.0, ttft_s=0.1, tpot_s=0.05,
                    total_s=1.0, acceptance_rate=0.1, mean_accepted_length=tokens, acceptance_by_position=[],
                    identical_fraction=1.0, per_category={"coding": {"speedup_median": speedup}})

    base = method(1.0, None) | {"tpot_s": 0.726, "acceptance_rate": None}
    slowed = {"baseline": base, "hf-prompt-lookup": method(18.98, 1.2), "ngram": method(1.3, 1.1)}
    warnings = timing_warnings(slowed)
    assert len(warnings) == 1 and warnings[0].startswith("hf-prompt-lookup: 18.98x with 1.20 tokens per target forward")
    assert "726 ms" in warnings[0]
    assert timing_warnings({"baseline": base, "draft": method(2.0, 3.2), "peer": method(5.0, None)}) == []
    config = dict(target="t", date="d", commit="c", machine="m", threads=2, num_prompts=1, max_new_tokens=8,
                  temperature=0.7, dtype="float32")
    write_report(tmp_path / "out", config, slowed, {"prompts": []})
    assert "**Timing warning.** hf-prompt-lookup: 18.98x" in (tmp_path / "out" / "results.md").read_text()


def test_other_cpu_counts_other_processes_and_the_hypervisor_not_this_process(monkeypatch):
    """OtherCpu, what generate --compare, bench and tune judge their timings by: a process spinning beside the block
    counts (measured for real); this process's own CPU time, its threads' and children's included, is taken off the
    system's busy time and the hypervisor's steal is kept apart (psutil's figures given)."""
    import time
    from types import SimpleNamespace as NS

    import psutil

    from hf_spec.device import OtherCpu

    spinning = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)  # started
        with OtherCpu() as other:
            time.sleep(1.5)
    finally:
        spinning.kill()
        spinning.wait()
    assert other.wall_s >= 1.5 and other.other_s >= 0.5 * other.wall_s  # one core spinning, shared with what else runs

    system = iter([NS(user=10.0, nice=0.0, system=5.0, idle=100.0, irq=0.0, softirq=0.0, steal=1.0),
                   NS(user=13.0, nice=0.5, system=6.0, idle=101.0, irq=0.1, softirq=0.1, steal=1.25)])
    own = iter([NS(user=2.0, system=1.0, children_user=0.0, children_system=0.0),
                NS(user=4.0, system=1.5, children_user=0.2, children_system=0.0)])
    monkeypatch.setattr(psutil, "cpu_times", lambda: next(system))
    monkeypatch.setattr(psutil, "Process", lambda: NS(cpu_times=lambda: next(own)))
    with OtherCpu() as other:
        pass
    # busy 4.7 s (user, nice, system, irq, softirq), this process 2.7 s of it: 2.0 s the others'; steal 0.25 s
    assert other.other_s == pytest.approx(2.0) and other.steal_s == pytest.approx(0.25)


def test_runs_timed_while_other_processes_took_the_cpu_are_flagged(tmp_path):
    """A share of the cores above CONTENTION_SHARE taken by other processes or the hypervisor while a method's runs
    were timed is named, per method, in the bench report, tune's warnings and generate --compare's; a quiet run's
    share (0.0006-0.01 cores on a quiet 2-core VM; 0.03 here), a block too short for the kernel's 10 ms ticks, or the
    same share on a machine with more cores, is not."""
    from hf_spec.bench import contention_warning, timing_warnings, tune_warnings, write_report
    from hf_spec.bench.report import CONTENTION_MIN_WALL_S, CONTENTION_SHARE

    # (other processes' cores, the hypervisor's, seconds timed)
    quiet = {"plain decoding": (0.03, 0.0, 20.0), "speculative decoding": (0.03, 0.0, 10.0)}
    assert contention_warning(quiet, cores=2) is None
    loaded = dict(quiet, **{"plain decoding": (1.0, 0.0, 20.0)})  # a test suite beside plain decoding: one core
    warning = contention_warning(loaded, cores=2)
    assert warning.startswith("other processes took CPU while runs were timed (cores of this machine's 2: plain "
                              "decoding 1.00): ") and "speculative decoding" not in warning
    assert contention_warning(loaded, cores=16) is None and 1.0 < CONTENTION_SHARE * 16
    stolen = contention_warning({"draft": (0.01, 0.5, 10.0)}, cores=2)
    assert "draft 0.01 (and 0.50 taken by the hypervisor)" in stolen
    assert contention_warning({"x": (1.0, 0.0, 0.9 * CONTENTION_MIN_WALL_S)}, cores=2) is None

    def method(other_cores):
        return dict(speedup_median=1.5, speedup_total=1.5, tokens_per_s=1.0, ttft_s=0.1, tpot_s=0.05, total_s=30.0,
                    acceptance_rate=0.5, mean_accepted_length=2.0, acceptance_by_position=[], identical_fraction=1.0,
                    per_category={}, other_cpu_cores=other_cores, steal_cores=0.0)

    summary = {"baseline": method(0.8) | {"acceptance_rate": None, "mean_accepted_length": None}, "draft": method(0.01)}
    (warning,) = timing_warnings(summary)
    assert "baseline 0.80" in warning and "draft" not in warning
    assert timing_warnings({"baseline": method(0.01), "draft": method(0.02)}) == []
    config = dict(target="t", date="d", commit="c", machine="m", threads=2, num_prompts=1, max_new_tokens=8,
                  temperature=0.7, dtype="float32")
    write_report(tmp_path / "out", config, summary, {"prompts": []})
    assert f"**Timing warning.** {warning}" in (tmp_path / "out" / "results.md").read_text()
    # runs from before the figures were measured (an older results.json combined in, an older journal resumed) are
    # left out of the share, not a reason to drop the others' load
    from hf_spec.bench import Method, summarize

    def run(other=None):
        return {"new_tokens": 10, "total_s": 10.0, "ttft_s": 1.0, "tpot_s": 1.0, "tokens_per_s": 1.0,
                "tokens": [1] * 10} | ({} if other is None else {"other_cpu_s": other, "steal_s": 0.0})

    raw = {"prompts": [{"question_id": q, "category": "c", "prompt_tokens": 5,
                        "runs": {"baseline": run(b), "ngram@k=auto": run(n)}}
                       for q, b, n in (("old", None, None), ("new", 10.0, 0.0))]}
    mixed = summarize(raw, [Method("baseline", "baseline"), Method("ngram@k=auto", "hf-spec", "auto", "ngram")], True)
    assert mixed["baseline"]["other_cpu_cores"] == 1.0 and mixed["ngram@k=auto"]["other_cpu_cores"] == 0.0
    assert any("baseline 1.00" in w for w in timing_warnings(mixed))
    quiet_verify = [1.0, 0.95, 0.97]
    assert tune_warnings(quiet_verify, 0.19, 0.2, shares=quiet) == []
    assert tune_warnings(quiet_verify, 0.19, 0.2, shares=loaded)[0].startswith("other processes took CPU")


def test_tune_flags_timings_another_process_distorted():
    """A new user's tune beside other work: T_1 = 1537 ms, a 3-position verify at 0.59 of it, and 38 ms in the next
    run. A verify under MIN_VERIFY_COST of a plain step, plain decoding's TPOT moving between the calibration and
    the check, or a prediction far from its measurement, is flagged (one warning each); a quiet run's figures (AMX
    bfloat16: 0.95-1.14; predictions within 2-24%) are not."""
    from hf_spec.bench import MIN_VERIFY_COST, tune_warnings

    quiet = [1.0, 0.95, 0.97, 1.02]
    assert tune_warnings(quiet, 0.19, 0.2) == [] and tune_warnings(quiet, 0.19) == []
    slowed = [1.0, 0.25, 0.2, 0.3]
    (warning,) = tune_warnings(slowed, 1.537)
    assert warning.startswith("a verify of 2 positions measured 0.25") and "1537 ms" in warning
    assert min(slowed[1:]) < MIN_VERIFY_COST < min(quiet)
    (drift,) = tune_warnings(quiet, 1.537, 0.038)
    assert "from 1537 ms (calibration) to 38 ms (check)" in drift
    assert len(tune_warnings(slowed, 1.537, 0.038)) == 2
    # a third's: 0.65x predicted, 0.07x measured (+814%), T_1 and the verify costs plausible in both runs
    assert tune_warnings(quiet, 0.19, 0.2, {2: 0.24, 3: -0.2}) == []
    (missed,) = tune_warnings(quiet, 0.19, 0.2, {1: 0.1, 2: 8.14, 3: -0.4})
    assert missed.startswith("the prediction missed the measured speedup by +814% at k = 2, -40% at k = 3,")


def test_model_check_uses_the_runs_own_measurements():
    from hf_spec.bench import model_check
    from hf_spec.metrics import SpecStats
    from hf_spec.tuning import expected_speedup

    # one prompt: plain decoding 11 tokens in 1 s prefill + 10 s; hf-spec: prefill 1 s, then 4 steps of k=2,
    # drafting 0.2 s and verifying 1.5 s each, accepting 2, 1, 0, 2 tokens (11 tokens)
    stats = SpecStats(num_sequences=1, num_row_steps=5, num_emitted_tokens=11, ttft_s=1.0, total_s=7.8,
                      draft_time_s=0.8, verify_time_s=1.0 + 6.0, accepted_per_position=[3, 2],
                      drafted_per_position=[4, 4], reached_per_position=[4, 3], num_draft_tokens=8,
                      num_accepted_tokens=5, num_drafts=4)
    prompts = [{"runs": {"baseline": {"total_s": 11.0, "ttft_s": 1.0, "new_tokens": 11},
                         "m": {"total_s": 7.8, "ttft_s": 1.0, "new_tokens": 11, "stats": stats}}}]
    chk = model_check(prompts, "m", 2)
    assert chk["verify_cost"] == pytest.approx(1.5) and chk["cost_ratio"] == pytest.approx(0.1)
    assert chk["conditional_acceptance"] == pytest.approx([0.75, 2 / 3])
    assert chk["predicted"] == pytest.approx(expected_speedup([0.75, 2 / 3], 2, 0.1, [1.0, 1.5, 1.5]))
    assert chk["measured"] == pytest.approx(1.0 / 0.68)
    assert model_check(prompts, "baseline", None) is None


@pytest.mark.slow
def test_bench_end_to_end(tmp_path):
    out = tmp_path / "bench"
    r = run("bench", "--target", "smollm2-135m", "--methods",
            "baseline,draft:smollm2-135m,medusa:smollm2-135m,hybrid:draft:smollm2-135m,hf-assisted,hf-prompt-lookup", "--k-sweep", "1,2,auto",
            "--categories", "coding,qa", "--per-category", "1", "--max-new-tokens", "12", "--out", str(out),
            "--draft-dtype", "bfloat16")  # the target itself as its draft, unquantized: acceptance near 1 below
    assert r.returncode == 0, r.stderr[-3000:]
    # transformers' warning about its own call of the assistant's generate is nothing a bench user can change
    assert "Passing `generation_config` together with" not in r.stderr
    res = json.loads((out / "results.json").read_text())
    assert res["config"]["num_prompts"] == 2 and res["config"]["categories"] == ["coding", "qa"]
    assert res["config"]["seed"] == 0  # the default, recorded: sampled runs under several seeds are told apart
    names = ["baseline"] + [f"{m}@k={k}" for m in ("draft:smollm2-135m", "medusa:smollm2-135m", "hybrid:draft:smollm2-135m", "hf-assisted",
                                                   "hf-prompt-lookup") for k in (1, 2)]
    autos = [f"{m}@k=auto" for m in ("draft:smollm2-135m", "medusa:smollm2-135m", "hybrid:draft:smollm2-135m")]
    assert sorted(res["methods"]) == sorted(names + autos)
    for k in (1, 2, "auto"):  # the hybrid drafter's sources, counted; both drafted in a run this short
        assert set(res["methods"][f"hybrid:draft:smollm2-135m@k={k}"]["per_source"]) <= {"suffix", "draft"}
    for name in autos:  # the controller's record: the k it used, how often speculation was off
        assert res["methods"][name]["identical_fraction"] == 1.0
        # from the runs' own k per step (whether speculation paid on 12 tokens is timing, not this test's claim;
        # so is whether a step was plain: a call may start from the T_1 of earlier calls)
        ks_run = [k for p in res["prompts"] for k in p["runs"][name]["stats"]["k_per_step"]]
        assert res["methods"][name]["speculation_off_fraction"] == pytest.approx(ks_run.count(0) / len(ks_run))
        assert res["methods"][name]["k_mean"] == pytest.approx(sum(ks_run) / len(ks_run))
        assert max(ks_run) > 0
    for name, m in res["methods"].items():
        for key in KEYS:
            assert key in m, (name, key)
        assert set(m["per_category"]) == {"coding", "qa"}
        assert m["identical_fraction"] == 1.0, name  # greedy: every method reproduces plain decoding
    assert res["methods"]["baseline"]["speedup_median"] == 1.0
    for name in names[1:]:
        m = res["methods"][name]
        assert 0.0 <= m["acceptance_rate"] <= 1.0 and m["mean_accepted_length"] >= 1.0
        assert len(m["acceptance_by_position"]) <= int(name[-1])
    # a draft identical to the target accepts everything
    assert res["methods"]["draft:smollm2-135m@k=2"]["acceptance_rate"] > 0.9
    assert set(res["speedup_vs_k"]) == {"draft:smollm2-135m", "medusa:smollm2-135m", "hybrid:draft:smollm2-135m",
                                        "hf-assisted",
                                        "hf-prompt-lookup"}
    assert all(p["predicted"] is not None for p in res["speedup_vs_k"]["draft:smollm2-135m"])
    for name in names[1:7]:  # hf-spec's methods: the model checked with the run's own measurements
        assert res["methods"][name]["model"]["predicted"] > 0 and res["methods"][name]["model"]["measured"] > 0
    assert "The speedup model" in (out / "results.md").read_text()
    md = (out / "results.md").read_text()
    assert "| method | TTFT | TPOT | total | tokens/s | speedup | acceptance | mean accepted | identical |" in md
    assert "Every greedy output is token-identical to plain decoding." in md
    assert not any("first_difference" in r for p in res["prompts"] for r in p["runs"].values())
    for png in ("speedup_by_category.png", "acceptance_by_position.png", "speedup_vs_k.png"):
        assert (out / png).stat().st_size > 1000
    # results.json reads back into the same report, and runs combine (a later run's prompts replace the first's)
    from hf_spec.bench import load_results, summarize

    config, raw, methods = load_results(out / "results.json")
    assert markdown_table(summarize(raw, methods, greedy=True)) == markdown_table(res["methods"])
    combined = tmp_path / "combined"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "combine_bench.py"), "--out", str(combined), str(out), str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    again = json.loads((combined / "results.json").read_text())
    assert again["config"]["replaced_question_ids"] == [p["question_id"] for p in res["prompts"]]
    assert markdown_table(again["methods"]) == markdown_table(res["methods"])
    # a run split by category combines into one report that names every category
    other = tmp_path / "other"
    other.mkdir()
    moved = dict(res, prompts=[dict(p, question_id="x" + str(p["question_id"]), category="elsewhere")
                               for p in res["prompts"]])
    moved["config"] = dict(res["config"], categories=["elsewhere"])
    (other / "results.json").write_text(json.dumps(moved))
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "combine_bench.py"), "--out", str(combined), str(out),
                        str(other)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    both = json.loads((combined / "results.json").read_text())["config"]
    assert both["categories"] == res["config"]["categories"] + ["elsewhere"] and both["replaced_question_ids"] == []
    # a report written again without the sweep leaves no plot of the earlier one behind
    write_report(out, config, summarize(raw, methods, greedy=True), raw)
    assert not (out / "speedup_vs_k.png").exists() and (out / "speedup_by_category.png").stat().st_size > 1000


@pytest.mark.slow
def test_tune_end_to_end():
    # 16 tokens: k cycles 1,1,2,2,3 (a draft of 3 fits before max_new_tokens; a step's recorded k is what fits)
    r = run("tune", "--target", "smollm2-135m", "--drafter", "draft:smollm2-135m", "--k-max", "3",
            "--categories", "coding", "--max-new-tokens", "16", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    assert len(res["conditional_acceptance"]) == 3 and all(0 <= a <= 1 for a in res["conditional_acceptance"])
    # the calibration run (k cycling 1..3 in the loop) measured a draft and verify cost for every k
    assert len(res["verify_cost"]) == 4 and res["verify_cost"][0] == 1.0 and all(v > 0 for v in res["verify_cost"])
    assert len(res["cost_ratio"]) == 3 and all(c > 0 for c in res["cost_ratio"]) and res["t_plain_s"] > 0
    assert set(res["predicted"]) == {"1", "2", "3"} and 1 <= res["best_k"] <= 3
    assert res["speculation_pays"] == (res["predicted"][str(res["best_k"])] > 1) and isinstance(res["warnings"], list)
    assert res["measured"] and str(res["best_k"]) in res["measured"]
    for k, m in res["measured"].items():
        assert m["identical_fraction"] == 1.0
        assert m["prediction_error"] == pytest.approx(res["predicted"][k] / m["speedup_decode"] - 1)
    # a drafter that proposes at most 4 tokens (SmolLM2's Medusa heads): k is calibrated and predicted to 4 only
    r = run("tune", "--target", "smollm2-135m", "--drafter", "medusa:smollm2-135m", "--k-max", "6",
            "--categories", "coding", "--max-new-tokens", "16", "--no-check", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    assert set(json.loads(r.stdout)["predicted"]) == {"1", "2", "3", "4"}


def test_bench_bad_input():
    r = run("bench", "--target", "smollm2-135m", "--methods", "baseline,warp-drive", "--out", "/tmp/never")
    assert r.returncode == 2 and "unknown method" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_interrupted_bench_resumes_from_its_journal(smol, tmp_path, monkeypatch, capsys):
    import hf_spec.bench.runner as bench
    from hf_spec.prompts import load_questions

    model, tok = smol
    questions = load_questions(categories=["coding"], per_category=2)
    methods = parse_methods("ngram", [2])
    journal = tmp_path / "out" / ".progress.json"
    real = bench._run_once
    calls = {"n": 0}

    def counted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 5:  # 2 warm-up runs, prompt 1's 2 runs, then prompt 2 fails
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(bench, "_run_once", counted)
    kw = dict(max_new_tokens=4, progress=False, journal=journal)
    with pytest.raises(KeyboardInterrupt):
        bench.run_bench(model, tok, methods, questions, **kw)
    assert journal.exists()
    calls["n"] = -100  # no more failures
    capsys.readouterr()
    raw = bench.run_bench(model, tok, methods, questions, **dict(kw, progress=True))
    assert calls["n"] == -100 + 2 + 2  # warm-up again, then only prompt 2
    assert f"resuming from {journal}: 1 of 2 prompts already measured" in capsys.readouterr().err  # it says so
    assert [p["question_id"] for p in raw["prompts"]] == [q.question_id for q in questions]
    first = raw["prompts"][0]["runs"]["ngram"]  # read back from the JSON journal as the run made it
    assert isinstance(first["stats"], SpecStats) and first["stats"].num_emitted_tokens == len(first["tokens"])
    with pytest.raises(ValueError, match="other settings"):
        bench.run_bench(model, tok, methods, questions, max_new_tokens=5, progress=False, journal=journal)
    # a corpus is a setting too: a run resumed with another corpus would mix prompts drafted from two
    suffix, other = parse_methods("suffix", [2]), dict(kw, journal=tmp_path / "other" / ".progress.json")
    calls["n"] = 0  # fails again at the 5th run: 2 warm-up runs, prompt 1's 2 runs
    with pytest.raises(KeyboardInterrupt):
        bench.run_bench(model, tok, suffix, questions, corpus=["def f(): pass"], **other)
    with pytest.raises(ValueError, match="other settings"):
        bench.run_bench(model, tok, suffix, questions, corpus=["def g(): return 1"], **other)


def test_bench_names_every_difference_from_plain_decoding():
    """Each greedy output that is not plain decoding's gets its first differing token, the two tokens, the target's
    logit gap there and a near-tie verdict, in results.json's runs and in results.md."""
    from transformers import AutoTokenizer

    import hf_spec
    from hf_spec.bench.report import differences_table
    from hf_spec.bench.runner import _name_differences

    from .conftest import tiny_llama

    target = tiny_llama(seed=3)
    tokenizer = AutoTokenizer.from_pretrained(hf_spec.provision("smollm2-135m"))
    prompt = torch.tensor([0, 5, 9, 5, 9, 5, 3, 7])
    base = target.generate(prompt[None], max_new_tokens=10, do_sample=False, min_new_tokens=10)[0, 8:].tolist()
    with torch.no_grad():
        logits = target(torch.tensor([[*prompt.tolist(), *base[:4]]])).logits[0, -1]
    worst = int(logits.argmin())  # far below the argmax: no rounding explains choosing it
    kept = {"baseline": {"tokens": base}, "same": {"tokens": list(base)},
            "wrong": {"tokens": base[:4] + [worst] + base[5:]}, "short": {"tokens": base[:6]}}
    _name_differences(target, tokenizer, prompt, kept)
    assert "first_difference" not in kept["same"] and "first_difference" not in kept["baseline"]
    d = kept["wrong"]["first_difference"]
    assert d["new_token"] == 4 and d["plain"] == tokenizer.decode([base[4]])
    assert d["speculative"] == tokenizer.decode([worst])
    assert d["logit_gap"] == pytest.approx(float(logits[base[4]] - logits[worst]), rel=1e-4) and d["logit_gap"] > 0
    assert d["near_tie"] is False and d["bound"] == hf_spec.kernels.NEAR_TIE_BOUNDS["float32"]
    assert kept["short"]["first_difference"]["new_token"] == 6 and kept["short"]["first_difference"]["near_tie"] is False
    per_prompt = [{"question_id": 7, "category": "coding",
                   "runs": {n: r | {"identical": r["tokens"] == base} for n, r in kept.items()}}]
    md = "\n".join(differences_table(per_prompt))
    assert "| wrong | 7 (coding) | 4 |" in md and "**not a near-tie**" in md and "stopped earlier" in md
    assert "| same |" not in md


def test_bench_turns_the_method_order_from_prompt_to_prompt(tokenizer, monkeypatch):
    """No method always runs first: the order turns by one method per prompt and repeat, and every method still
    runs once per prompt and repeat (a fixed order put plain decoding first on every prompt)."""
    from types import SimpleNamespace

    import hf_spec.bench.runner as bench
    from hf_spec.prompts import load_questions

    order = []

    def fake(target, m, inputs, gen_kwargs, drafters, hf_draft, seed):
        order.append(m.name)
        return {"total_s": 1.0, "tokens": [1, 2, 3]}

    monkeypatch.setattr(bench, "_run_once", fake)
    target = SimpleNamespace(name_or_path="fake", dtype=torch.float32, device=torch.device("cpu"))
    methods = parse_methods("ngram,suffix", [2])
    questions = load_questions(categories=["coding", "writing"], per_category=2)
    bench.run_bench(target, tokenizer, methods, questions, max_new_tokens=4, repeats=2, progress=False)
    n = len(methods)
    rounds = [order[i:i + n] for i in range(n, len(order), n)]  # after the warm-up round
    assert len(rounds) == len(questions) * 2
    assert all(sorted(r) == sorted(m.name for m in methods) for r in rounds)
    assert {r[0] for r in rounds} == {m.name for m in methods}
    assert [r[0] for r in rounds[:n]] == [m.name for m in methods]


def test_questions_past_the_targets_context_are_refused_before_any_run(tokenizer, monkeypatch):
    """bench on a model of short context ran into an IndexError traceback (learned positions) or garbage (rotary),
    where generate refuses the prompt (a break-it finding): bench and tune now check every question first, before
    any drafter loads."""
    import hf_spec.bench.runner as runner
    from hf_spec.bench import Method, run_bench
    from hf_spec.prompts import chat_inputs, load_questions

    from .conftest import tiny_llama

    target = tiny_llama(vocab_size=len(tokenizer))
    target.config.max_position_embeddings = 64  # a summarization prompt is several hundred tokens
    questions = load_questions(categories=["summarization"], per_category=1)
    monkeypatch.setattr(runner, "make_drafter", lambda *a, **k: pytest.fail("a drafter was made"))
    with pytest.raises(ValueError, match=r"1 question of 1 reach past the context of the model, 64 positions, .*: "
                                         r"\d+ \(summarization\); leave their categories out"):
        run_bench(target, tokenizer, [Method("baseline", "baseline"), Method("ngram", "hf-spec", 3, "ngram")],
                  questions, max_new_tokens=8, progress=False)
    # all fit but for the new tokens: the most that fits every question, from the longest (not one retry each)
    questions = load_questions(categories=["writing", "coding"], per_category=2)
    longest = max(chat_inputs(tokenizer, q.text)["input_ids"].shape[1] for q in questions)
    target.config.max_position_embeddings = longest + 4
    with pytest.raises(ValueError, match=rf"The longest question, .* and 8 new tokens exceed .* at most 4 new tokens"):
        run_bench(target, tokenizer, [Method("baseline", "baseline")], questions, max_new_tokens=8, progress=False)
