"""strip_billing and capture in process, as `stable-prefix up` loads them, one request at a time.

`AddonPipeline.send(...)` builds a mitmproxy flow from the bytes and headers a
client sent, runs the hooks mitmdump would (request, responseheaders,
response) with a small JSON answer, and returns what was forwarded, what the
addons logged for that request and the capture records it left. Fast enough
for thousands of fuzz examples; `tests/addons/test_fuzz_proxy.py` runs fewer of them
through a real mitmdump.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from mitmproxy import http
from mitmproxy.test import taddons, tflow, tutils

from stable_prefix.addons.capture import Capture
from tests.support.proxy_addons import ProxyAddons

SERVED_MODEL = "served-model"
MAX_TOKENS_CAP = 4096
ANSWER = json.dumps({"type": "message", "content": [], "usage": {"input_tokens": 5, "output_tokens": 1}}).encode()


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@dataclass
class Forwarded:
    request: http.Request  # as it left the proxy
    warnings: list[str]  # the addons' log lines at WARNING or above for this request
    records: list[Path]  # capture records written for it
    leftovers: list[Path]  # temporary files left in the capture folder


class AddonPipeline:
    def __init__(self, strip: ProxyAddons, capture: Capture, session_dir: Path, lines: _Lines) -> None:
        self.strip, self.capture, self.session_dir, self.lines = strip, capture, session_dir, lines
        self.seen: set[Path] = set()

    def send(self, path: str, content: bytes, headers: list[tuple[str, str]], chunked: bool = False) -> Forwarded:
        framing = ("transfer-encoding", "chunked") if chunked else ("content-length", str(len(content)))
        pairs = [(name.encode(), value.encode("latin-1")) for name, value in [*headers, framing]]
        request = tutils.treq(host="127.0.0.1", port=8000, method=b"POST", path=path.encode(), headers=http.Headers(pairs), content=content)
        flow = tflow.tflow(req=request)
        del self.lines.records[:]
        for addon in (self.strip, self.capture):
            addon.request(flow)
        flow.response = tutils.tresp(headers=http.Headers(((b"content-type", b"application/json"),)), content=ANSWER)
        for addon in (self.strip, self.capture):
            addon.responseheaders(flow)
        self.capture.response(flow)
        warnings = [record.getMessage() for record in self.lines.records if record.levelno >= logging.WARNING]
        files = set(self.session_dir.iterdir()) if self.session_dir.exists() else set()
        new = sorted(files - self.seen)
        self.seen = files
        return Forwarded(flow.request, warnings, [p for p in new if p.suffix == ".json"], [p for p in files if p.suffix == ".tmp"])


@contextlib.contextmanager
def addon_pipeline(capture_dir: Path, session: str = "fuzz") -> Iterator[AddonPipeline]:
    strip, capture = ProxyAddons(), Capture()
    lines = _Lines()
    logger = logging.getLogger("stable_prefix")
    logger.addHandler(lines)
    previous_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        with taddons.context(strip, capture) as tctx:
            tctx.configure(capture, capture_dir=str(capture_dir), capture_session=session)
            tctx.configure(strip, upstream_model=SERVED_MODEL, max_tokens_cap=MAX_TOKENS_CAP)
            yield AddonPipeline(strip, capture, capture_dir / session, lines)
    finally:
        logger.removeHandler(lines)
        logger.setLevel(previous_level)
