"""How long a long session's page takes: 500 requests written by the real addons, the page rendered
(`report --html`'s code), then opened in headless Chromium (Debian's `chromium`). Printed, not a test:
timings on a shared machine are not a pass or a fail.

    python -m stable_prefix.bench.probes.session_page_load [--requests 500] [--keep DIR]

The session: the demo's Claude Code-shaped session (`bench/workload/session.py`) generated again with a new
seed until there are enough requests (so each new seed's main lane breaks: a new conversation), answered as a
prefix cache would (what a request shares from the start with its lane's previous one is reused, 4 bytes a
token) with a time to first token of 30 ms plus 1/3 ms per token prefilled. What is timed in the browser:
the page's own navigation timing (from the start of navigation to the end of the load event, and the first
paint), read by a script the probe appends to a copy of the page, and the whole Chromium process beside an
empty page's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from stable_prefix.bench.clients.capture_in_process import Exchange, write_session
from stable_prefix.bench.workload.session import generate_session
from stable_prefix.captures.session import read_session
from stable_prefix.captures.session_html import render
from stable_prefix.tools import page_browser

BYTES_PER_TOKEN = 4
# Appended to a copy of the page: the navigation's timings once the load event is over, in the DOM for --dump-dom.
TIMING_SCRIPT = """<script>addEventListener('load', () => setTimeout(() => {
  const nav = performance.getEntriesByType('navigation')[0];
  const paint = performance.getEntriesByName('first-contentful-paint')[0];
  const out = document.createElement('pre'); out.id = 'timing';
  out.textContent = JSON.stringify({load_event_end_ms: nav.loadEventEnd, dom_content_loaded_ms: nav.domContentLoadedEventEnd,
    first_contentful_paint_ms: paint ? paint.startTime : null, elements: document.getElementsByTagName('*').length});
  document.body.append(out);
}, 0));</script>"""


def exchanges(count: int) -> list[Exchange]:
    made: list[Exchange] = []
    previous_by_lane: dict[str, bytes] = {}
    seed = 0
    while len(made) < count:
        for request in generate_session(seed, 0.2):
            prompt = json.dumps(request.body).encode()
            earlier = previous_by_lane.get(request.lane, b"")
            previous_by_lane[request.lane] = prompt
            tokens, reused = len(prompt) // BYTES_PER_TOKEN, len(os.path.commonprefix([prompt, earlier])) // BYTES_PER_TOKEN
            usage = {"input_tokens": tokens - reused, "cache_read_input_tokens": reused, "output_tokens": 2}
            made.append(Exchange(request.body, usage, 0.03 + (tokens - reused) / 3000, dict(request.headers)))
        seed += 1
    return made[:count]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stable_prefix.bench.probes.session_page_load", description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--keep", type=Path, help="write the folder and the page here (default: a temporary folder, removed)")
    args = parser.parse_args(argv)
    if page_browser.chromium() is None:
        print("error: chromium not found (Debian: apt-get install chromium)")
        return 1
    work = args.keep or Path(tempfile.mkdtemp(prefix="session-page-load-"))
    try:
        started = time.perf_counter()
        folder = write_session(work, exchanges(args.requests), name="long")
        print(f"{args.requests} requests written by the addons in process to {folder}: {time.perf_counter() - started:.1f} s")
        started = time.perf_counter()
        session = read_session(folder)
        page = render(session)
        print(f"read and rendered (report --html's code): {time.perf_counter() - started:.2f} s; {len(session.lanes)} lanes, "
              f"{len(session.breaks)} breaks, {len(page) / 1024:.0f} KiB of HTML")
        (work / "page.html").write_text(page, encoding="utf-8")
        timed = work / "timed.html"
        timed.write_text(page.replace("</body>", TIMING_SCRIPT + "</body>"), encoding="utf-8")
        (work / "empty.html").write_text("<!doctype html><title>empty</title>", encoding="utf-8")
        for name in ("empty.html", "timed.html"):
            started = time.perf_counter()
            view = page_browser.dump_dom((work / name).as_uri(), size="1280,1500")
            wall = time.perf_counter() - started
            timing = view.output.split('<pre id="timing">', 1)[1].split("</pre>", 1)[0] if '<pre id="timing">' in view.output else "{}"
            print(f"chromium --dump-dom {name}: {wall:.2f} s for the whole process; in the page: {timing}; console: {view.console or 'nothing'}")
        return 0
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
