"""Take the demo's screenshot (docs/images/demo.png) from a real run: start ``demo/app.py`` (its default
models unless demo options follow ``--``), submit one prompt in headless chromium (Debian's, driven by
Playwright), wait for the speculative stream and the plain decoding after it, and save the page.

    python scripts/demo_screenshot.py --max-new 96 --k 3
    python scripts/demo_screenshot.py --out /tmp/demo.png -- --target smollm2-135m --draft smollm2-135m

Prints the statistics the page shows, so the numbers in the picture can be quoted.
"""

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    argv = sys.argv[1:]
    demo_args = argv[argv.index("--") + 1:] if "--" in argv else []
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "docs" / "images" / "demo.png"))
    p.add_argument("--prompt", default="Write a Python function that checks whether a number is prime.")
    p.add_argument("--method", default="draft model", help="the page's drafter label")
    p.add_argument("--k", default="auto")
    p.add_argument("--max-new", type=int, default=96)
    p.add_argument("--timeout", type=float, default=1800, help="seconds for loading and the two generations")
    p.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if not Path(args.chromium).exists():
        p.error(f"no chromium at {args.chromium}: apt-get install chromium, or pass --chromium PATH")
    from playwright.sync_api import expect, sync_playwright

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = Path(tempfile.mkdtemp()) / "runs.jsonl"
    proc = subprocess.Popen([sys.executable, str(ROOT / "demo" / "app.py"), "--port", str(port), "--log", str(log),
                             *demo_args])
    url, deadline = f"http://127.0.0.1:{port}/", time.time() + args.timeout
    try:
        while True:
            try:
                urllib.request.urlopen(url, timeout=2)
                break
            except OSError:
                if proc.poll() is not None:
                    print("the demo exited", file=sys.stderr)
                    return 1
                if time.time() > deadline:
                    print("the demo did not start in time", file=sys.stderr)
                    return 1
                time.sleep(1)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=args.chromium, args=[
                "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url)
            page.locator("#prompt textarea").fill(args.prompt)
            page.get_by_label(args.method).check()
            page.locator("#k input").click()
            page.get_by_role("option", name=args.k, exact=True).click()
            page.locator("#max_new input").fill(str(args.max_new))
            page.locator("#compare input").set_checked(True)
            page.locator("#generate").click()
            expect(page.locator("#status")).to_contain_text("finished",
                                                            timeout=max(1.0, deadline - time.time()) * 1000)
            expect(page.locator("#acceptance_plot img")).to_have_count(1, timeout=30_000)
            page.screenshot(path=args.out, full_page=True)
            print(page.locator("#stats").inner_text())
            browser.close()
        print(f"saved {args.out}; run log: {log}")
        return 0
    finally:
        proc.terminate()
        proc.wait(timeout=60)


if __name__ == "__main__":
    sys.exit(main())
