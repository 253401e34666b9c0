"""The Gradio demo. Mechanics on a tiny random model: closing a request's stream (what Gradio does when its
page goes away) or pressing Stop stops its generation within one token and the next request waits for it;
plain decoding is measured once per prompt and settings; bad input is a ``gr.Error``. Then the real app in
a real headless browser (Debian's chromium driven by Playwright), on the real SmolLM2-135M with its shipped
Medusa heads: accepted and rejected tokens marked, the speedup shown, a closed tab's generation stopped, two
pages at once each with its own stream. What ran is read from the app's run log (``--log``). A screenshot
is saved as a test artifact (``$HF_SPEC_ARTIFACTS``, default ``test-artifacts/``)."""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from transformers import BatchEncoding

from hf_spec.demo import DemoModels, render_tokens, stream
from hf_spec.events import StepEvent

from .conftest import tiny_llama

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(os.environ.get("HF_SPEC_ARTIFACTS", Path(__file__).resolve().parents[1] / "test-artifacts"))


def test_the_demo_help_is_the_demos_own():
    """``hf-spec demo --help`` prints the command line's copy of the demo's description (kept there so that the help
    needs no import of gradio and torch): the first paragraph of the demo module's docstring."""
    import hf_spec.demo
    from hf_spec.cli import DEMO_DESCRIPTION

    assert DEMO_DESCRIPTION == hf_spec.demo.__doc__.split("\n\n")[0]


def test_bad_serving_flags_and_a_target_folder_fail_before_any_model_loads(tmp_path, monkeypatch, capsys):
    """Break-it findings: --port 99999 or -5, a port in use and --host 256.1.1.1 were tracebacks once the models had
    loaded; --log naming a folder failed at the first run; and a target given as a folder was taken for its own
    Medusa heads folder ("config.json has no num_heads"). Each is now a one-line error before any model loads, and
    a target folder has no default heads."""
    import socket

    import hf_spec.demo as demo
    from hf_spec.medusa.heads import SHIPPED_DIR, default_heads

    monkeypatch.setattr(demo, "load_models", lambda *a, **k: pytest.fail("a model loaded"))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            free = probe.getsockname()[1]
        for argv, says in ((["--port", "99999"], "a port is 1 to 65535"), (["--port", "-5"], "a port is 1 to 65535"),
                           (["--port", "0"], "a port is 1 to 65535"),  # gradio serves nothing at "any free port"
                           (["--port", str(taken)], f"cannot serve on 127.0.0.1:{taken}"),
                           (["--host", "256.1.1.1"], "cannot serve on 256.1.1.1"),
                           (["--log", str(tmp_path)], "cannot append to it"),
                           (["--log", str(tmp_path / "missing" / "x.log")], "cannot append to it")):
            assert demo.main(["--port", str(free), *argv]) == 2, argv
            assert says in capsys.readouterr().err, argv
    assert default_heads("smollm2-135m") == SHIPPED_DIR / "smollm2-135m"  # shipped heads for a short name
    folder = tmp_path / "smollm2-135m"
    folder.mkdir()
    for target in (str(folder), "HuggingFaceTB/SmolLM2-135M", ""):  # a model's folder or hub id: no default heads
        assert default_heads(target) is None
    monkeypatch.chdir(tmp_path)  # a local folder named like the short name is the model's
    assert default_heads("smollm2-135m") is None


def test_render_marks_each_kind_of_token():
    ev = lambda step, d, a, e: StepEvent(step, len(d), [d], [a], [e], 0.0, 0.0, 0.0, [False])  # noqa: E731
    html = render_tokens([ev(0, [], 0, [1]), ev(1, [2, 3, 4], 1, [2, 5]), ev(2, [6, 7], 2, [6, 7, 8])],
                         lambda t: f"<{t}>")
    assert html.count('class="hfspec-acc"') == 3  # token 2 (step 1), tokens 6 and 7 (step 2)
    assert '<span class="hfspec-fix">&lt;1&gt;</span>' in html  # the prefill's token
    assert '<span class="hfspec-acc">&lt;2&gt;</span><span class="hfspec-rej">&lt;3&gt;</span>' \
           '<span class="hfspec-rej">&lt;4&gt;</span><span class="hfspec-fix">&lt;5&gt;</span>' in html
    assert '<span class="hfspec-bonus">&lt;8&gt;</span>' in html  # the whole draft accepted: a bonus token


def test_a_tree_step_shows_its_accepted_path_and_the_candidates_rejected_there():
    """A tree step: root children 2 and 3, 2's children 4 and 5; the target took 3 (the second child), then
    its own token 9. The stream shows 3 accepted, 3's children none, so the bonus 9; the tree view shows every
    node under its parent, the path green and the rest struck through."""
    from hf_spec.demo import render_tree

    tree = StepEvent(1, 2, [[2, 3, 4, 5, 6]], [1], [[3, 9]], 0.0, 0.0, 0.0, [False], parents=[[-1, -1, 0, 0, 1]],
                     accepted_path=[[1]])
    decode = lambda t: f"<{t}>"  # noqa: E731
    html = render_tokens([tree], decode)
    # 3 accepted, then 3's child 6 rejected, then the target's correction 9
    assert html.endswith('<span class="hfspec-acc">&lt;3&gt;</span><span class="hfspec-rej">&lt;6&gt;</span>'
                         '<span class="hfspec-fix">&lt;9&gt;</span></div>')
    leaf = StepEvent(2, 2, [[2, 3, 4]], [2], [[2, 4, 7]], 0.0, 0.0, 0.0, [False], parents=[[-1, -1, 0]],
                     accepted_path=[[0, 2]])
    assert render_tokens([leaf], decode).endswith('<span class="hfspec-bonus">&lt;7&gt;</span></div>')  # a leaf
    view = render_tree(tree, decode)
    assert "5 drafted nodes, 1 accepted" in view and view.count("<li>") == 5
    assert view.count('class="hfspec-acc"') == 1 and view.count('class="hfspec-rej"') == 4
    # 2's children under 2, 6 under 3
    assert '&lt;2&gt;</span><ul><li><span class="hfspec-rej">&lt;4&gt;</span></li><li>' in view
    assert '&lt;3&gt;</span><ul><li><span class="hfspec-rej">&lt;6&gt;</span></li></ul>' in view
    assert render_tree(None, decode) == ""


def test_a_stop_inside_an_accepted_draft_shows_the_token_accepted_and_nothing_rejected():
    """Drafted [EOS, 10, 22], the target took EOS and the row stopped there (the event counts it as the target's
    own token): it showed as rejected, then again as the correction, with 10 and 22 rejected though the stop cut
    them. A chain and a tree; a row that did not finish keeps the correction."""
    from hf_spec.demo import render_tree

    decode = lambda t: f"<{t}>"  # noqa: E731
    for parents in (None, [[-1, 0, 1, 0]]):
        drafted = [[1, 10, 22]] if parents is None else [[1, 10, 22, 5]]
        stop = StepEvent(1, 3, drafted, [0], [[1]], 0.0, 0.0, 0.0, [True], parents=parents, accepted_path=[[0]])
        assert render_tokens([stop], decode).endswith('<span class="hfspec-acc">&lt;1&gt;</span></div>')
        view = render_tree(stop, decode)
        assert "1 accepted" in view and "hfspec-rej" not in view and "target's token" not in view
        going_on = StepEvent(1, 3, drafted, [0], [[7]], 0.0, 0.0, 0.0, [True], parents=parents)  # a correction
        assert '<span class="hfspec-fix">&lt;7&gt;</span>' in render_tokens([going_on], decode)


def test_a_tree_with_equal_siblings_shows_the_branch_the_target_took():
    """Two root children with the same token 5 (a custom drafter may propose them), the second with child 6; the
    target took the second branch, 5 then 6, then its own 9: the event's accepted path says which 5, so the
    first 5 is rejected and 6 accepted (searching the tree by token took the first 5 and lost the 6)."""
    from hf_spec.demo import render_tree

    decode = lambda t: f"<{t}>"  # noqa: E731
    ev = StepEvent(1, 2, [[5, 5, 6]], [2], [[5, 6, 9]], 0.0, 0.0, 0.0, [False], parents=[[-1, -1, 1]],
                   accepted_path=[[1, 2]])
    assert render_tokens([ev], decode).endswith('<span class="hfspec-acc">&lt;5&gt;</span>'
                                                '<span class="hfspec-acc">&lt;6&gt;</span>'
                                                '<span class="hfspec-bonus">&lt;9&gt;</span></div>')
    view = render_tree(ev, decode)
    assert "2 accepted" in view
    assert view.startswith('<div class="hfspec-out hfspec-tree">step 1: 3 drafted nodes, 2 accepted then the '
                           "target's token")
    assert '<ul><li><span class="hfspec-rej">&lt;5&gt;</span></li><li><span class="hfspec-acc">&lt;5&gt;</span>' \
           '<ul><li><span class="hfspec-acc">&lt;6&gt;</span></li></ul></li></ul>' in view


def test_a_character_split_over_tokens_shows_whole():
    """A byte-level tokenizer splits an emoji or a CJK character over several tokens: decoded one by one each
    showed U+FFFD (the page showed "\ufffd\ufffd\ufffd\ufffd" for a rainbow). Decoded in context, the token that
    completes the character shows it whole, the ones before it nothing; a rejected draft token is decoded after
    the accepted ones (the third byte completes the character, a space does not); the texts join to the decoded
    text."""
    from hf_spec.demo import TokenTexts

    decode = lambda ids: bytes(ids).decode("utf-8", errors="replace")  # noqa: E731  (ids are bytes)
    rainbow, kanji = list("\U0001f308".encode()), list("\u6f22".encode())  # 4 bytes, 3 bytes
    texts = TokenTexts(decode)
    assert [texts.push(t) for t in [ord("a")] + rainbow] == ["a", "", "", "", "\U0001f308"]
    # step 1: drafted the kanji's 3 bytes and a space; accepted 2, the third rejected for 0x8c (U+6F0C)
    step = StepEvent(1, 4, [kanji + [32]], [2], [kanji[:2] + [0x8c]], 0.0, 0.0, 0.0, [False])
    html = render_tokens([step], None, texts)
    assert html == ('<div class="hfspec-out"><span class="hfspec-acc"></span><span class="hfspec-acc"></span>'
                    '<span class="hfspec-rej">\u6f22</span><span class="hfspec-rej"> </span>'
                    '<span class="hfspec-fix">\u6f0c</span></div>')
    seq = [ord("a")] + rainbow + kanji[:2] + [0x8c]
    assert TokenTexts(decode).join(seq) == decode(seq) == "a\U0001f308\u6f0c"
    # a rejected chain's rest is decoded token after token: a character split inside it shows once, whole
    texts = TokenTexts(decode)
    texts.push(ord("a"))
    assert texts.candidates(rainbow + [ord("b")]) == ["", "", "", "\U0001f308", "b"] and texts.ids == [ord("a")]
    # a character cut by the output's end (max new tokens, Stop) still shows, as U+FFFD, and in the run log's text
    assert TokenTexts(decode).join([ord("H")] + rainbow[:3]) == "H\ufffd"


def test_the_tree_view_shows_a_character_split_over_nodes_whole():
    """The tree view decoded each node alone, so a character over several nodes showed U+FFFD on each: decoded
    after its ancestors, the node that completes it shows it, its ancestors nothing; a leaf that leaves it
    incomplete shows U+FFFD; the target's token is decoded after the accepted path."""
    from hf_spec.demo import render_tree

    decode_ids = lambda ids: bytes(ids).decode("utf-8", errors="replace")  # noqa: E731  (ids are bytes)
    k0, k1, k2 = "\u6f22".encode()
    # root children k0 and "a"; k0 -> k1 -> k2 (accepted: k0, k1), k1 -> 0x8c too; then the target's "!"
    ev = StepEvent(1, 3, [[k0, ord("a"), k1, k2, 0x8c]], [2], [[k0, k1, ord("!")]], 0.0, 0.0, 0.0, [False],
                   parents=[[-1, -1, 0, 2, 2]], accepted_path=[[0, 2]])
    view = render_tree(ev, lambda t: decode_ids([t]), decode_ids)
    assert '<span class="hfspec-acc"></span><ul><li><span class="hfspec-acc"></span><ul><li>' \
           '<span class="hfspec-rej">\u6f22</span></li><li><span class="hfspec-rej">\u6f0c</span>' in view
    assert '<span class="hfspec-rej">a</span>' in view and view.count("\ufffd") == 1  # the target's, below
    assert "then the target's token <span class=\"hfspec-fix\">\ufffd!</span>" in view  # k0 k1 then "!": invalid
    leaf = StepEvent(1, 1, [[k0]], [0], [[ord("b")]], 0.0, 0.0, 0.0, [False], parents=[[-1]], accepted_path=[[]])
    assert '<span class="hfspec-rej">\ufffd</span>' in render_tree(leaf, lambda t: decode_ids([t]), decode_ids)


def test_a_prompt_longer_than_the_context_is_refused():
    """A prompt (with its new tokens) beyond the model's positions (SmolLM2: 8192) ran for minutes on a CPU,
    holding the one generation slot, and wrote garbage: now a message before any model runs."""
    models = _tiny_models()  # max_position_embeddings 256, one token per byte
    with pytest.raises(ValueError, match="too long: 300 tokens .* the model, 256 positions; shorten the prompt.$"):
        next(stream(models, "x" * 300, "n-gram", 2, 0.0, 1.0, 8))
    with pytest.raises(ValueError, match="ask for at most 56 new tokens"):
        next(stream(models, "x" * 200, "n-gram", 2, 0.0, 1.0, 57))
    assert not [r for r in models.log.records if r["event"] == "start"]  # nothing ran


def test_demo_drafters_are_built_once_and_checked_per_request():
    """One drafter per page label for the app's life (a call never changes it, so requests can share it);
    a k above what the drafter can propose, or a drafter not loaded, is a message before any work."""
    import hf_spec

    target = tiny_llama(seed=3)
    heads = hf_spec.MedusaHeads(hf_spec.MedusaConfig(3, 1, target.config.hidden_size, target.config.vocab_size,
                                                     "shared-lm-head")).bind(target)
    models = DemoModels(target, None, {"medusa": hf_spec.MedusaDrafter(heads), "n-gram": hf_spec.NgramDrafter()})
    assert models.drafter("medusa") is models.drafter("medusa") and models.drafter("none") is None
    with pytest.raises(ValueError, match="at most 3 tokens"):
        next(stream(models, "hi", "medusa", 5, 0.0, 1.0, 8))
    with pytest.raises(ValueError, match="--draft NAME"):
        next(stream(models, "hi", "draft model", 2, 0.0, 1.0, 8))
    with pytest.raises(ValueError, match="unknown drafter"):
        next(stream(models, "hi", "eagle", 2, 0.0, 1.0, 8))
    with pytest.raises(ValueError, match="drafts chains only"):
        next(stream(models, "hi", "n-gram", 2, 0.0, 1.0, 8, tree="16"))
    with pytest.raises(ValueError, match="Draft tree must be one of"):
        next(stream(models, "hi", "medusa", 2, 0.0, 1.0, 8, tree="7"))
    assert models.drafter("medusa").num_speculative_tokens == 3
    assert not models.log.records  # nothing ran


class _ByteTokenizer:
    """A stand-in tokenizer for the tiny model: bytes to ids 2..31 (no chat template)."""

    chat_template = None

    def __call__(self, text, return_tensors="pt"):
        ids = [2 + b % 30 for b in text.encode()]
        return BatchEncoding({"input_ids": torch.tensor([ids]),
                              "attention_mask": torch.ones(1, len(ids), dtype=torch.long)})

    def decode(self, ids, skip_special_tokens=False):
        return "".join(f"<{i}>" for i in ids)


def _tiny_models():
    import hf_spec

    target = tiny_llama(seed=5)
    target.generation_config.eos_token_id = None  # runs to max_new_tokens: the tests decide when it stops
    return DemoModels(target, _ByteTokenizer(), {"n-gram": hf_spec.NgramDrafter()})


def test_a_medusa_tree_streams_with_its_tree_view():
    """Medusa's 8-node tree through the page's stream: the output is plain greedy's, the last update's tree
    view shows the last speculative step's draft, and the run log records the tree size."""
    import hf_spec

    models = _tiny_models()
    heads = hf_spec.MedusaHeads(hf_spec.MedusaConfig(3, 1, models.target.config.hidden_size,
                                                     models.target.config.vocab_size, "shared-lm-head")).bind(models.target)
    models.drafters["medusa"] = hf_spec.MedusaDrafter(heads)
    *_, last = [u for u in stream(models, "abc abc", "medusa", 3, 0.0, 1.0, 12, False, tree="8") if u is not None]
    assert "finished" in last[4] and "drafted node" in last[5] and "<li>" in last[5]
    plain = models.target.generate(**models.tokenizer("abc abc"), max_new_tokens=12, do_sample=False)
    shown = re.findall(r'class="hfspec-(?:acc|fix|bonus)">&lt;(\d+)&gt;', last[0])  # the emitted tokens, in order
    assert [int(t) for t in shown] == plain[0, -12:].tolist()
    assert _records(models, 1)["start"]["tree"] == 8


def _records(models, run):
    return {r["event"]: r for r in models.log.records if r["run"] == run}


@pytest.mark.parametrize("how", ["closed", "stop"])
def test_closing_the_stream_stops_its_generation_and_the_next_request_waits(how):
    """Gradio closes a request's generator when its page goes away; the Stop button sets the page's run's stop
    flag (``DemoModels.stop``), and that run's stream then ends as any does, with status "stopped". Either way
    the generation keeps at most one more token than it had when the cancel was recorded, and a request that
    arrived meanwhile starts only after it ended: the target forward in flight is held until both have
    happened."""
    models = _tiny_models()
    in_forward, release, forwards = threading.Event(), threading.Event(), []

    def hold_the_fourth_forward(module, args, kwargs):
        forwards.append(1)
        if len(forwards) == 4:
            in_forward.set()
            assert release.wait(60)

    handle = models.target.register_forward_pre_hook(hold_the_fourth_forward, with_kwargs=True)
    try:
        first = stream(models, "abc def abc def", "n-gram", 2, 0.0, 1.0, 200, True, "page-1")
        next(first)  # running
        assert in_forward.wait(60)
        if how == "closed":
            first.close()  # what Gradio does for a closed tab: the generator's cleanup stops the generation
        else:
            assert models.stop("page-1") == 1 and models.stop("page-2") is None
        second = stream(models, "something else", "n-gram", 2, 0.0, 1.0, 8, False, "page-2")
        update = next(second)
        assert "waiting for the previous generation to stop" in update[4]
        release.set()
        *_, last = [u for u in second if u is not None]
        if how == "stop":
            *_, stopped = [u for u in first if u is not None]
            assert stopped[4] == "run 1: stopped" and models.stop("page-1") is None
    finally:
        release.set()
        handle.remove()
    assert last[4] == "run 2: finished" and not models.running
    one, two = _records(models, 1), _records(models, 2)
    assert one["cancel"]["phase"] == "speculative" and one["cancel"]["tokens"] >= 1
    assert one["end"]["stopped"] and one["end"]["phase"] == "speculative"
    assert one["end"]["tokens"] <= one["cancel"]["tokens"] + 1 < 200
    order = [(r["event"], r["run"]) for r in models.log.records]
    assert order == [("start", 1), ("cancel", 1), ("end", 1), ("start", 2), ("end", 2)]
    assert two["end"]["tokens"] == 8 and not two["end"]["stopped"]


def test_the_page_offers_the_suffix_and_hybrid_drafters_it_loads():
    """load_models builds the suffix drafter, and the hybrid over the draft model; the page offers and runs them
    (chains and trees). They were built but missing from the page's list, so asking for one was "unknown"."""
    import hf_spec

    from hf_spec.demo import METHODS

    models = _tiny_models()
    models.drafters["suffix"] = hf_spec.SuffixDrafter()
    models.drafters["hybrid"] = hf_spec.HybridDrafter(hf_spec.DraftModelDrafter(tiny_llama(seed=6)))
    assert {"suffix", "hybrid"} <= set(METHODS)
    for method in ("suffix", "hybrid"):
        assert models.drafter(method) is models.drafters[method]
        for tree in ("none", "6"):
            *_, last = [u for u in stream(models, "abc abc abc", method, 2, 0.0, 1.0, 8, False, tree=tree)
                        if u is not None]
            assert "| new tokens | 8 |" in last[1], last[1]


def test_plain_decoding_is_measured_once_per_prompt_and_settings():
    models = _tiny_models()

    def run(prompt, max_new):
        *_, last = [u for u in stream(models, prompt, "n-gram", 2, 0.0, 1.0, max_new) if u is not None]
        return last

    first, again, other = run("abc abc abc", 12), run("abc abc abc", 12), run("abc abc abc", 10)
    starts = [r for r in models.log.records if r["event"] == "start"]
    ends = [r for r in models.log.records if r["event"] == "end"]
    assert [s["plain"] for s in starts] == ["measure", "cached", "measure"]
    assert [e["phase"] for e in ends] == ["plain", "speculative", "plain"]  # the cached one ran no plain decoding
    assert "Speedup" in first[1] and "plain decoding (measured) | 12 tokens" in first[1]
    assert "measured earlier on this server" in again[1] and "plain decoding (cached) | 12 tokens" in again[1]
    assert again[3] == first[3] != ""  # the remembered plain text is shown again
    assert "plain decoding (measured) | 10 tokens" in other[1]
    # a greedy run is compared token by token (float32 here: identical) ...
    assert "**Identical to plain decoding**: yes" in first[1] and "**Identical to plain decoding**: yes" in again[1]
    # ... and a difference is located and judged as generate --compare judges it (the plain tokens made to differ)
    remembered = models.plain_cache[("abc abc abc", 12, 0.0, 1.0)]
    remembered["ids"] = remembered["ids"][:3] + [(remembered["ids"][3] + 1) % 64] + remembered["ids"][4:]
    differs = run("abc abc abc", 12)[1]
    assert "**Identical to plain decoding**: no, the outputs differ from new token 3 on" in differs, differs
    assert "not a near-tie" in differs


def test_the_speedup_warns_when_other_processes_took_cpu_while_either_run_was_timed(monkeypatch):
    """The speedup line gets generate --compare's contention warning where other processes took more than a
    tenth of the cores while the speculative or the plain run was timed; a cached plain rate keeps its own
    figures, and the run log records each phase's share."""
    import hf_spec.demo as demo

    loads = []  # other processes' cores during each timed generation, in the order they run

    class FakeOtherCpu:  # OtherCpu's figures, made up
        def __enter__(self):
            self.t0 = time.perf_counter()
            return self

        def __exit__(self, *exc):
            self.wall_s = max(1.5, time.perf_counter() - self.t0)  # judged: CONTENTION_MIN_WALL_S is 1 s
            self.other_s, self.steal_s = loads.pop(0) * self.wall_s, 0.0

    monkeypatch.setattr(demo, "OtherCpu", FakeOtherCpu)
    models = _tiny_models()

    def run(prompt, *cores):
        loads[:] = cores
        *_, last = [u for u in stream(models, prompt, "n-gram", 2, 0.0, 1.0, 6) if u is not None]
        assert not loads  # one figure per generation: speculative, then plain unless cached
        return last[1]

    assert "Speedup" in (quiet := run("abc abc", 0.0, 0.0)) and "Warning" not in quiet
    assert "measured earlier" in (again := run("abc abc", 0.0)) and "Warning" not in again
    # plain decoding ran beside another process: named, and again where its rate is reused
    def warning(stats):
        return next((line for line in stats.splitlines() if line.startswith("**Warning**")), "")

    assert "plain decoding 0.90" in (line := warning(run("xyz xyz", 0.0, 0.9))) and "speculative" not in line
    assert "measured earlier" in (again := run("xyz xyz", 0.0)) and "plain decoding 0.90" in warning(again)
    line = warning(run("abc abc", 0.5))  # now the speculative run had company
    assert "speculative decoding 0.50" in line and "plain decoding" not in line
    ends = [r for r in models.log.records if r["event"] == "end"]
    assert ends[2]["other_cpu_cores"] == {"speculative": 0.0, "plain": 0.9}
    assert ends[-1]["other_cpu_cores"] == {"speculative": 0.5}


def test_bad_input_is_a_gradio_error():
    gr = pytest.importorskip("gradio")
    from hf_spec.demo import _handler

    handler = _handler(_tiny_models())
    for args, message in [(("  ", "n-gram", "auto", "none", 0.0, 1.0, 8, True), "Empty prompt"),
                          (("hi", "n-gram", "13", "none", 0.0, 1.0, 8, True), "k must be auto or an integer from 1 to 12"),
                          (("hi", "n-gram", "auto", "none", 0.0, 1.0, 0, True), "Max new tokens must be a whole number"),
                          (("hi", "n-gram", "auto", "none", 0.0, 1.0, 2.5, True), "Max new tokens must be a whole number"),
                          (("hi", "n-gram", "auto", "none", "hot", 1.0, 8, True), "Temperature must be a number"),
                          (("hi", "n-gram", "auto", "none", 3.0, 1.0, 8, True), "Temperature must be between"),
                          (("hi", "n-gram", "auto", "none", 0.0, 0.0, 8, True), "Top-p must be in"),
                          (("hi", "medusa", "auto", "none", 0.0, 1.0, 8, True), "no medusa drafter loaded"),
                          (("hi", "n-gram", "auto", "16", 0.0, 1.0, 8, True), "drafts chains only")]:
        with pytest.raises(gr.Error, match=message):
            next(handler(*args, None))


def test_the_page_is_sent_only_what_changed():
    """Each status line and each plot goes to the page once while the run streams (an update still on its way
    when Stop is pressed must not overwrite the status line, and a plot costs a PNG each time it is sent); the
    last update repeats every output in full, for API callers."""
    gr = pytest.importorskip("gradio")
    from hf_spec.demo import _handler

    models, go, updates = _tiny_models(), threading.Semaphore(0), []

    def one_forward_per_update(module, args):
        assert go.acquire(timeout=60)

    handle = models.target.register_forward_pre_hook(one_forward_per_update)
    try:
        for update in _handler(models)("abc abc abc", "n-gram", "2", "none", 0.0, 1.0, 24, True, None):
            updates.append(update)
            go.release()
    finally:
        handle.remove()
    skip = gr.skip()
    *running, last = updates
    statuses = [u[4] for u in running if u[4] != skip]
    assert statuses[-1] == "run 1: finished" and len(statuses) == len(set(statuses)) >= 3  # spec, plain, done
    plots = [u[2] for u in running if u[2] is not skip and u[2] != skip]
    assert len({id(p) for p in plots}) == len(plots) >= 1
    tokens = [u[0] for u in running if u[0] != skip]
    assert len(tokens) > len(statuses)  # the token updates in between left the status line alone
    # the last update carries every output (what gradio_client returns), the values last sent
    assert skip not in last and last[4] == statuses[-1] and last[2] is plots[-1] and last[0] == tokens[-1]


# ---- the real app in a real browser ------------------------------------------------------------------

def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """(url, run log path) of the demo serving SmolLM2-135M with a draft copy and its Medusa heads."""
    port, log = _port(), tmp_path_factory.mktemp("demo") / "runs.jsonl"
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve().parents[1] / "demo" / "app.py"),
                             "--target", "smollm2-135m", "--draft", "smollm2-135m", "--medusa", "smollm2-135m",
                             "--dtype", "float32", "--port", str(port), "--log", str(log)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + 300
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2)
            break
        except OSError:
            if proc.poll() is not None:
                pytest.fail("the demo exited: " + proc.stdout.read()[-3000:])
            time.sleep(1)
    else:
        proc.kill()
        pytest.fail("the demo did not start in 300 s")
    yield url, log
    proc.terminate()
    proc.wait(timeout=30)


def _log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _records_of(path: Path, run: int, until: str = "end", timeout: float = 120) -> dict:
    """The run's log records by event, once its ``until`` record is written (a cancelled run ends after the
    step it was in)."""
    deadline = time.time() + timeout
    while True:
        records = {r["event"]: r for r in _log(path) if r["run"] == run}
        if until in records or time.time() > deadline:
            return records
        time.sleep(0.2)


def _run_of(page) -> int:
    """The run number the page's status line names."""
    return int(page.locator("#status").inner_text().split(":")[0].split()[-1])


def _wait_running(page, after: int = 0, tokens: int = 8) -> int:
    """Wait until the page shows a run numbered above ``after`` in speculative decoding with more than
    ``tokens`` tokens drawn; return its number."""
    page.wait_for_function(
        """([after, tokens]) => {
            const m = document.querySelector('#status').innerText.match(/run (\\d+): speculative decoding/);
            return m && +m[1] > after && document.querySelectorAll('#tokens .hfspec-out span').length > tokens;
        }""", arg=[after, tokens], timeout=120_000)
    return _run_of(page)


def _shown_text(page) -> str:
    """The output as the page shows it: every token span but the rejected drafts."""
    return page.evaluate("Array.from(document.querySelectorAll('#tokens .hfspec-out span:not(.hfspec-rej)'))"
                         ".map(e => e.textContent).join('')")


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip("needs Debian's chromium (.ci/run installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        yield b
        b.close()


def _fill(page, prompt: str, max_new: int, method: str | None = None, k: str | None = None, compare=True,
          tree: str | None = None):
    """Set the form. The prompt goes last: on a page just loaded, the first edit was now and then lost by
    Gradio's front end (6.0-6.11: the default prompt was submitted), and the widgets before it need the page's
    scripts running."""
    if method:
        page.get_by_label(method).check()
    if k:
        page.locator("#k input").click()
        page.get_by_role("option", name=k, exact=True).click()
    if tree:
        page.locator("#tree_size input").click()
        page.get_by_role("option", name=tree, exact=True).click()
    page.locator("#max_new input").fill(str(max_new))
    page.locator("#compare input").set_checked(compare)
    page.locator("#prompt textarea").fill(prompt)


@pytest.mark.slow
def test_demo_in_a_headless_browser(app, browser):
    from playwright.sync_api import expect

    url, log = app
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.goto(url)
    # bad input: an empty prompt is a Gradio error message in the page, and nothing runs
    _fill(page, "", 8)
    page.locator("#generate").click()
    expect(page.get_by_test_id("toast-body")).to_contain_text("Empty prompt", timeout=60_000)
    page.get_by_test_id("toast-close").first.click()
    # Medusa heads at k = 3 with 16-node trees on a code prompt: some drafted tokens accepted, some rejected, the
    # last step's tree drawn; then plain decoding of the same prompt, and the speedup
    _fill(page, "Write a Python function that returns the n-th Fibonacci number.", 48, "medusa", "3", tree="16")
    page.locator("#generate").click()
    expect(page.locator("#status")).to_contain_text("finished", timeout=300_000)
    assert page.locator("#tree_view li").count() > 1 and "drafted nodes" in page.locator("#tree_view").inner_text()
    assert page.locator("#tokens .hfspec-acc").count() > 0
    assert page.locator("#tokens .hfspec-rej").count() > 0
    assert page.locator("#tokens .hfspec-fix").count() > 0
    stats = page.locator("#stats").inner_text()
    for key in ("Speedup", "acceptance rate", "mean accepted length", "tokens/s", "plain decoding (measured)"):
        assert key in stats
    assert page.locator("#plain textarea").input_value().strip()
    expect(page.locator("#acceptance_plot img")).to_have_count(1, timeout=30_000)  # the plot is drawn
    page.screenshot(path=str(ARTIFACTS / "demo.png"), full_page=True)
    # Stop: the run's stop flag is set; the generation ends within one token of the cancel, as a finished event
    _fill(page, "Count from 1 to 1000, one number per line.", 1024, "n-gram", compare=False, tree="none")
    before = _run_of(page)
    page.locator("#generate").click()
    run = _wait_running(page, after=before)
    page.locator("#stop").click()
    expect(page.locator("#status")).to_contain_text("stopped", timeout=60_000)
    # the event ends (its progress overlay hides: no "Error" there), so the page takes Generate again
    expect(page.locator('#tokens [data-testid="status-tracker"]')).to_have_class(re.compile(r"\bhide\b"),
                                                                                timeout=60_000)
    # absurd max tokens: a message
    page.locator("#max_new input").fill("100000")
    page.locator("#generate").click()
    expect(page.get_by_test_id("toast-body")).to_contain_text("Max new tokens must be", timeout=60_000)
    page.close()
    records = _records_of(log, run)
    assert records["end"]["stopped"] and records["end"]["tokens"] <= records["cancel"]["tokens"] + 1 < 1024
    assert (ARTIFACTS / "demo.png").stat().st_size > 10_000


@pytest.mark.slow
def test_a_closed_tab_stops_its_generation_and_the_next_request_waits(app, browser):
    from playwright.sync_api import expect

    url, log = app
    gone = browser.new_page()
    gone.goto(url)
    _fill(gone, "Count from 1 to 1000, one number per line.", 1024, "n-gram", compare=False)
    gone.locator("#generate").click()
    run = _wait_running(gone)
    gone.close()  # the tab goes away mid-generation
    page = browser.new_page()
    page.goto(url)
    _fill(page, "Write a haiku about the sea.", 16, "n-gram", compare=False)
    page.locator("#generate").click()
    expect(page.locator("#status")).to_contain_text("finished", timeout=300_000)
    nxt = _run_of(page)
    page.close()
    mine = _records_of(log, run)
    records = _log(log)
    assert mine["end"]["stopped"] and mine["end"]["tokens"] <= mine["cancel"]["tokens"] + 1 < 1024
    order = [(r["event"], r["run"]) for r in records]
    assert order.index(("start", nxt)) > order.index(("end", run))  # never two generations at once


@pytest.mark.slow
def test_two_pages_at_once_each_get_their_own_stream(app, browser):
    from playwright.sync_api import expect

    url, log = app
    prompts = ["Write a haiku about the sea.", "Write a Python function that adds two numbers."]
    pages = [browser.new_context().new_page() for _ in prompts]
    for page, prompt in zip(pages, prompts):
        page.goto(url)
        _fill(page, prompt, 16, "n-gram", "3")
    for page in pages:
        page.locator("#generate").click()
    for page in pages:
        expect(page.locator("#status")).to_contain_text("finished", timeout=300_000)
    runs = [_run_of(page) for page in pages]
    records = _log(log)
    for page, prompt, run in zip(pages, prompts, runs):
        mine = {r["event"]: r for r in records if r["run"] == run}
        assert mine["start"]["prompt"] == prompt  # the run this page shows is the one it asked for
        assert _shown_text(page) == mine["end"]["text"]  # and every token it shows came from that run
        assert "Speedup" in page.locator("#stats").inner_text()
    assert _shown_text(pages[0]) != _shown_text(pages[1])
    sessions = {r["session"] for r in records if r["event"] == "start" and r["run"] in runs}
    assert len(sessions) == 2 and "" not in sessions  # two browser sessions
    order = [(r["event"], r["run"]) for r in records if r["run"] in runs]
    first, second = sorted(runs)
    assert order == [("start", first), ("end", first), ("start", second), ("end", second)]  # one at a time
    for page in pages:
        page.context.close()


@pytest.mark.slow
def test_the_demo_answers_gradio_client_by_name(app):
    """The demo is an API too: ``/generate`` and ``/stop`` by name, every input and output labelled, the result of
    a call the run's own text (greedy n-gram drafting's equal to plain decoding's), and ``/stop`` a status line
    always, stopping the calling client's run."""
    import html

    from gradio_client import Client

    url, log = app
    client = Client(url, verbose=False)
    api = client.view_api(return_format="dict", print_info=False)["named_endpoints"]
    assert {"/generate", "/stop"} <= set(api)
    labels = [p["label"] for p in api["/generate"]["parameters"] + api["/generate"]["returns"]]
    assert not [label for label in labels if not label or re.fullmatch(r"value_\d+", label)], labels
    tokens, stats, _, plain, status, _ = client.predict("Write a haiku about the sea.", "n-gram", "3", "none", 0.0,
                                                        1.0, 16, True, api_name="/generate")
    run = int(re.fullmatch(r"run (\d+): finished", status).group(1))
    end = next(r for r in _log(log) if r["run"] == run and r["event"] == "end")
    answer = re.sub(r'<div class="hfspec-legend">.*?</div>|<span class="hfspec-rej">.*?</span>', "", tokens)
    shown = html.unescape(re.sub(r"<[^>]+>", "", answer))
    assert shown == end["text"] == plain != ""  # the run's text, and greedy drafting changed nothing
    assert "| new tokens | 16 |" in stats and "Speedup" in stats

    # /stop stops this client's run (its session's) and says so, or that nothing of this session runs
    assert client.predict(api_name="/stop").startswith("nothing to stop")
    job = client.submit("Write a long story about a lighthouse keeper.", "none", "3", "none", 0.0, 1.0, 512, False,
                        api_name="/generate")
    deadline = time.time() + 120
    while not any(r["run"] > run and r["event"] == "start" for r in _log(log)) and time.time() < deadline:
        time.sleep(0.2)
    assert client.predict(api_name="/stop") == f"run {run + 1}: stopping"
    tokens, _, _, _, status, _ = job.result(timeout=120)
    end = next(r for r in _log(log) if r["run"] == run + 1 and r["event"] == "end")
    shown = html.unescape(re.sub(r"<[^>]+>", "", re.sub(r'<div class="hfspec-legend">.*?</div>', "", tokens)))
    assert status == f"run {run + 1}: stopped" and end["stopped"] and end["tokens"] < 512 and shown == end["text"]
