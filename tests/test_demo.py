"""The Gradio demo in a real headless browser (Debian's chromium driven by Playwright), on the real
SmolLM2-135M with its shipped Medusa heads: a prompt goes in, accepted and rejected tokens come out marked,
the statistics appear, bad input gets a message in the page. A screenshot is saved as a test artifact
(``$HF_SPEC_ARTIFACTS``, default ``test-artifacts/``)."""

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from hf_spec.demo import render_tokens
from hf_spec.events import StepEvent

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(os.environ.get("HF_SPEC_ARTIFACTS", Path(__file__).resolve().parents[1] / "test-artifacts"))


def test_render_marks_each_kind_of_token():
    ev = lambda step, d, a, e: StepEvent(step, len(d), [d], [a], [e], 0.0, 0.0, 0.0, [False])  # noqa: E731
    html = render_tokens([ev(0, [], 0, [1]), ev(1, [2, 3, 4], 1, [2, 5]), ev(2, [6, 7], 2, [6, 7, 8])],
                         lambda t: f"<{t}>")
    assert html.count('class="hfspec-acc"') == 3  # token 2 (step 1), tokens 6 and 7 (step 2)
    assert '<span class="hfspec-fix">&lt;1&gt;</span>' in html  # the prefill's token
    assert '<span class="hfspec-acc">&lt;2&gt;</span><span class="hfspec-rej">&lt;3&gt;</span>' \
           '<span class="hfspec-rej">&lt;4&gt;</span><span class="hfspec-fix">&lt;5&gt;</span>' in html
    assert '<span class="hfspec-bonus">&lt;8&gt;</span>' in html  # the whole draft accepted: a bonus token


def test_demo_drafters_are_built_once_and_checked_per_request():
    """One drafter per page label for the app's life (a call never changes it, so requests can share it);
    a k above what the drafter can propose, or a drafter not loaded, is a message before any work."""
    import threading

    import hf_spec
    from hf_spec.demo import DemoModels, stream

    from .conftest import tiny_llama

    target = tiny_llama(seed=3)
    heads = hf_spec.MedusaHeads(hf_spec.MedusaConfig(3, 1, target.config.hidden_size, target.config.vocab_size,
                                                     "shared-lm-head")).bind(target)
    models = DemoModels(target, None, {"medusa": hf_spec.MedusaDrafter(heads), "n-gram": hf_spec.NgramDrafter()})
    assert models.drafter("medusa") is models.drafter("medusa") and models.drafter("none") is None
    with pytest.raises(ValueError, match="at most 3 tokens"):
        next(stream(models, "hi", "medusa", 5, 0.0, 1.0, 8, False, threading.Event()))
    with pytest.raises(ValueError, match="--draft NAME"):
        next(stream(models, "hi", "draft model", 2, 0.0, 1.0, 8, False, threading.Event()))
    assert models.drafter("medusa").num_speculative_tokens == 3


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def app_url():
    port = _port()
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve().parents[1] / "demo" / "app.py"),
                             "--target", "smollm2-135m", "--draft", "smollm2-135m", "--medusa", "smollm2-135m",
                             "--dtype", "float32", "--port", str(port)],
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
    yield url
    proc.terminate()
    proc.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium (.ci/run installs it)")
def test_demo_in_a_headless_browser(app_url):
    from playwright.sync_api import expect, sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(app_url)
        # bad input: an empty prompt gets a message in the page, not a stack trace
        page.locator("#prompt textarea").fill("")
        page.locator("#generate").click()
        expect(page.locator("#error")).to_contain_text("Empty prompt", timeout=60_000)
        # Medusa heads at k = 3 on a code prompt: some drafted tokens accepted, some rejected
        page.locator("#prompt textarea").fill("Write a Python function that returns the n-th Fibonacci number.")
        page.get_by_label("medusa").check()
        page.locator("#k input").click()
        page.get_by_role("option", name="3", exact=True).click()
        page.locator("#max_new input").fill("48")
        page.locator("#generate").click()
        expect(page.locator("#stats")).to_contain_text("finished", timeout=300_000)
        assert page.locator("#error").inner_text().strip() == ""
        assert page.locator("#tokens .hfspec-acc").count() > 0
        assert page.locator("#tokens .hfspec-rej").count() > 0
        assert page.locator("#tokens .hfspec-fix").count() > 0
        stats = page.locator("#stats").inner_text()
        for key in ("acceptance rate", "mean accepted length", "tokens/s"):
            assert key in stats
        expect(page.locator("#acceptance_plot img")).to_have_count(1, timeout=30_000)  # the plot is drawn
        page.screenshot(path=str(ARTIFACTS / "demo.png"), full_page=True)
        # absurd max tokens: a message
        page.locator("#max_new input").fill("100000")
        page.locator("#generate").click()
        expect(page.locator("#error")).to_contain_text("Max new tokens must be between", timeout=60_000)
        browser.close()
    assert (ARTIFACTS / "demo.png").stat().st_size > 10_000
