"""Headless Chromium (Debian's `chromium`) over a page, as a person's browser shows it: a screenshot, the DOM
after the page's scripts ran, and what its console printed (an uncaught script error among it). For the
session page's browser test, its load-time probe and docs/session-page.png:

    python -m stable_prefix.tools.page_browser PAGE.html --out docs/session-page.png [--size 1280,1500]

Each call is one Chromium process with a profile of its own, removed after; nothing reaches the network
(the flags turn off Chromium's own background traffic; a page from disk or 127.0.0.1 asks for nothing else).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--hide-scrollbars", "--enable-logging=stderr", "--v=0"]
# Chromium's log line for a console message: `[pid:tid:date:INFO:CONSOLE:12] "Uncaught ReferenceError: …", source: …`
_CONSOLE_LINE = re.compile(r":CONSOLE(?::\d+)?\] (.*)$")
TIMEOUT_S = 120


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass(frozen=True)
class PageView:
    output: str  # the DOM after the scripts ran (`dump_dom`), or Chromium's own stdout
    console: list[str]  # every console message the page printed, script errors included


def _run(url: str, action: list[str], size: str) -> PageView:
    program = chromium()
    if program is None:
        raise FileNotFoundError("chromium not found (Debian: apt-get install chromium; make chromium)")
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        done = subprocess.run([program, *FLAGS, f"--user-data-dir={profile}", f"--window-size={size}", *action, url],
                              capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"chromium exited with status {done.returncode} on {url}: {done.stderr[-2000:]}")
    console = [match.group(1) for match in map(_CONSOLE_LINE.search, done.stderr.splitlines()) if match]
    return PageView(done.stdout, console)


def dump_dom(url: str, size: str = "1280,1000") -> PageView:
    """The DOM once the page loaded and its scripts ran, and its console."""
    return _run(url, ["--dump-dom"], size)


def screenshot(url: str, out: Path, size: str = "1280,1000") -> PageView:
    """A PNG of the window's `size` (WIDTH,HEIGHT) at `out`, and the page's console."""
    view = _run(url, [f"--screenshot={out.resolve()}"], size)
    if not out.exists():
        raise RuntimeError(f"chromium wrote no screenshot of {url}")
    return view


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stable_prefix.tools.page_browser", description=__doc__.split("\n\n")[0])
    parser.add_argument("page", type=Path, help="an HTML file")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    parser.add_argument("--size", default="1280,1500", help="window size WIDTH,HEIGHT")
    args = parser.parse_args(argv)
    if chromium() is None:
        print("error: chromium not found (Debian: apt-get install chromium)", file=sys.stderr)
        return 1
    view = screenshot(args.page.resolve().as_uri(), args.out, args.size)
    for line in view.console:
        print(f"console: {line}", file=sys.stderr)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
