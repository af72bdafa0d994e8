"""The session's page, live: `GET /stable-prefix/session` on the proxy's own port answers with the page of
the capture session being written (`captures/session_html.py`: per lane, tokens reused and prefilled, TTFT,
each break's cause and diff), reloading itself every few seconds, so a user watches the cache warm up while
the agent works. `stable-prefix up` loads it and prints the address.

    mitmdump -s addons/strip_billing.py -s addons/capture.py -s addons/session_page.py \
        --mode reverse:http://127.0.0.1:8000 --listen-host 127.0.0.1 -p 8080

The folder is the capture addon's current session; without capture.py, or before the first record, the
page says so. Answered only in reverse mode, where every path is the proxy's own (a forward proxy's
request for that path is meant for another server: passed through), and only to clients on this machine:
the page shows the session's prompts, as its records do. Records are read as they appear (each once,
`session.SessionReader`), in a worker thread: the proxy's event loop never waits on the disk.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from mitmproxy import ctx, http
from mitmproxy.proxy.mode_specs import ReverseMode

from stable_prefix.addons.exposure import is_loopback
from stable_prefix.captures.session import SessionReader
from stable_prefix.captures.session_html import render, waiting_page

logger = logging.getLogger(__name__)

PAGE_PATH = "/stable-prefix/session"
REFRESH_S = 5
HTML = {"content-type": "text/html; charset=utf-8", "cache-control": "no-store"}


def is_page_request(flow: http.HTTPFlow) -> bool:
    return (flow.request.method == "GET" and flow.request.path.split("?", 1)[0] == PAGE_PATH
            and isinstance(flow.client_conn.proxy_mode, ReverseMode))


def capture_session_dir() -> Path | None:
    """The folder the capture addon writes this session's records to (None: capture is not loaded, or has not
    claimed one yet)."""
    capture = ctx.master.addons.get("capture")
    return getattr(capture, "session_dir", None)


class SessionPage:
    def __init__(self) -> None:
        self.reader: SessionReader | None = None

    async def request(self, flow: http.HTTPFlow) -> None:
        if flow.response or not is_page_request(flow):
            return
        client_host = flow.client_conn.peername[0] if flow.client_conn.peername else ""
        if not is_loopback(client_host):
            flow.response = http.Response.make(403, f"stable-prefix: {PAGE_PATH} is served to this machine only (it shows the session's prompts)\n")
            return
        flow.response = http.Response.make(200, await asyncio.to_thread(self.page, capture_session_dir()), HTML)

    def page(self, folder: Path | None) -> str:
        if folder is None:
            return waiting_page("No capture session: load addons/capture.py beside this addon (stable-prefix up does, unless --no-capture).", REFRESH_S)
        if self.reader is None or self.reader.folder != folder:
            self.reader = SessionReader(folder)
        try:
            session = self.reader.read()
        except OSError as error:  # the folder went away (the capture budget), or cannot be read
            logger.warning(f"session_page: cannot read {folder} ({error}); the page says so")
            return waiting_page(f"Cannot read {folder}: {error}", REFRESH_S)
        if not session.lanes:
            return waiting_page(f"No request captured yet in {folder}. This page reloads every {REFRESH_S} s.", REFRESH_S)
        return render(session, refresh_s=REFRESH_S)


addons = [SessionPage()]
