"""Reads datavine's dashboard in headless Chromium, for tests/test_dashboard_browser.py.

Run as a separate process (``python -m tests.dashboard_page live URL GATE`` or
``... saved FILE``): TaskVine's ``Manager.wait`` holds the test process's GIL while the run
goes on, so a browser driven from a thread there would stall. Prints one JSON object.

- ``live URL GATE WORKER...``: opens the live page, waits until it shows each named worker
  and at least one bundle done, reads the count, creates the file ``GATE`` (the test's
  second half of tasks waits for it), waits until the count grows, prints both counts.
- ``saved FILE``: opens the saved HTML with every request that is not the file refused (it
  must not need the network), prints the header's figures and the tables' rows.

Every wait is bounded (:data:`WAIT_MS`). Chromium is Debian's (``DATAVINE_CHROMIUM``,
default /usr/bin/chromium), driven by Playwright without a downloaded browser.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from playwright.sync_api import Page, sync_playwright

CHROMIUM = os.environ.get("DATAVINE_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
WAIT_MS = 120_000


def figure(page: Page, name: str) -> int:
    """A figure of the page's header (``<b data-figure=name>``), read from what it shows."""
    return int(page.locator(f'[data-figure="{name}"]').first.inner_text().replace(",", ""))


def figures(page: Page) -> dict[str, str]:
    return page.evaluate("""() => {
        const doc = Bokeh.documents[0];
        const text = doc.get_model_by_name('progress').text;
        const box = document.createElement('div');
        box.innerHTML = text;
        const out = {};
        for (const b of box.querySelectorAll('[data-figure]')) {
            out[b.dataset.figure] = b.textContent;
        }
        return out;
    }""")


def wait_for_count(page: Page, name: str, above: int) -> int:
    page.wait_for_function(
        """([name, above]) => {
            const b = Bokeh.documents.length &&
                Bokeh.documents[0].get_model_by_name('progress');
            if (!b) return false;
            const m = b.text.match(new RegExp('data-figure="' + name + '">([0-9,]+)<'));
            return m && parseInt(m[1].replace(/,/g, '')) > above;
        }""", arg=[name, above], timeout=WAIT_MS)
    return figure(page, name)


def ready(page: Page) -> None:
    page.wait_for_function("() => window.Bokeh && Bokeh.documents && Bokeh.documents.length"
                           " > 0 && Bokeh.documents[0].get_model_by_name('progress')",
                           timeout=WAIT_MS)


def live(page: Page, url: str, gate: Path, workers: list[str]) -> dict[str, Any]:
    page.goto(url, timeout=WAIT_MS)
    ready(page)
    shown = []
    for name in workers:  # in the workers' table, as text on the page
        page.get_by_text(name, exact=True).first.wait_for(timeout=WAIT_MS)
        shown.append(name)
    first = wait_for_count(page, "bundles-done", 0)
    gate.write_text("go")
    second = wait_for_count(page, "bundles-done", first)
    return {"workers": shown, "first": first, "second": second,
            "state": page.evaluate("() => Array.from(Bokeh.documents[0]"
                                   ".get_model_by_name('workers').data.state)")}


def saved(page: Page, path: Path) -> dict[str, Any]:
    refused: list[str] = []

    def route(r: Any) -> None:
        if r.request.url.startswith("file:"):
            r.continue_()
        else:
            refused.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.goto(path.resolve().as_uri(), timeout=WAIT_MS)
    ready(page)
    page.locator('[data-figure="bundles-done"]').first.wait_for(timeout=WAIT_MS)
    workers = page.evaluate("() => Array.from(Bokeh.documents[0]"
                            ".get_model_by_name('workers').data.worker)")
    stream = page.evaluate("() => Bokeh.documents[0].get_model_by_name('stream').data"
                           ".outcome.length")
    return {"figures": figures(page), "bundles_done_shown": figure(page, "bundles-done"),
            "workers": workers, "stream_bars": stream, "refused": refused}


def main(argv: list[str]) -> int:
    mode = argv[0]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, timeout=WAIT_MS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1300})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            if mode == "live":
                out = live(page, argv[1], Path(argv[2]), argv[3:])
            else:
                out = saved(page, Path(argv[1]))
            out["errors"] = errors
        finally:
            browser.close()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
