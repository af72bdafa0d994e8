"""Record every agent API request, for `python -m stable_prefix.captures diff|report`.

    mitmdump -s addons/strip_billing.py -s addons/capture.py --mode reverse:http://127.0.0.1:8000 \
        --listen-host 127.0.0.1 -p 8080

Writes `<capture_dir>/<session>/NNNN-<lane>.json` for each `POST /v1/messages`,
`POST /v1/chat/completions` and `POST /v1/responses` (nothing for other flows):
method, path, headers with credentials redacted, the body as the client sent it
and as it was forwarded, the changes and prefix diagnosis (from strip_billing.py
when it is loaded, else computed here with no rules applied), and a response
summary: status, usage (incl. `cache_read_input_tokens` /
`prompt_tokens_details.cached_tokens` / `input_tokens_details.cached_tokens`),
time to headers, to the first body byte, to the first generated output (streamed
answers), and total; for the Responses API also the response's id and output
items (what the server holds for a later `previous_response_id`). Streamed answers are
observed as they pass, never buffered. Works alone or with strip_billing in
either order: the record is written when the response (or error) is complete.

Records hold the user's code and prompts: files are created 0600, the folders
this addon creates 0700. The default folder is `captures/sessions` under the
directory mitmdump was started in, never inside the installed package.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mitmproxy import ctx, exceptions, http

from stable_prefix.addons import exposure
from stable_prefix.addons.diagnosis import PrefixDiagnosis, PromptSnapshot
from stable_prefix.addons.request_body import FLOW_NOTES, api_of
from stable_prefix.addons.response_chains import ResponseChains
from stable_prefix.addons.sse_events import EventStream, merge_usage

logger = logging.getLogger(__name__)

RECORD_FORMAT = "stable-prefix capture 1"
# Relative: resolved against the working directory when the options are read.
DEFAULT_CAPTURE_DIR = Path("captures", "sessions")
PRIVATE_FILE_MODE = 0o600
PRIVATE_DIR_MODE = 0o700
REDACTED = "[redacted]"
SECRET_HEADERS = frozenset({"x-api-key", "authorization", "proxy-authorization", "cookie", "set-cookie", "anthropic-api-key"})
CAPTURE_NOTES = "capture"


def redacted_headers(headers: http.Headers) -> dict[str, str]:
    result: dict[str, str] = {}
    for name, value in headers.items(multi=True):
        name = name.lower()
        value = REDACTED if name in SECRET_HEADERS else value
        result[name] = f"{result[name]}, {value}" if name in result else value
    return result


def json_or_text(content: bytes | None) -> tuple[str, Any]:
    """("body", parsed JSON) or ("body_text", text) for a body that is not JSON."""
    try:
        return "body", json.loads(content or b"")
    except ValueError:
        return "body_text", (content or b"").decode("utf-8", "replace")


class UsageObserver:
    """A `flow.response.stream` callable that passes every chunk on unchanged
    (through `previous`, when another addon already transforms the stream)
    and picks the usage and the first output's time out of the events as they
    go by."""

    def __init__(self, previous: Callable | bool | None) -> None:
        self.previous = previous if callable(previous) else None
        self.events = EventStream(clock=time.time)  # flow timestamps are time.time()
        self.first_chunk_at: float | None = None

    @property
    def usage(self) -> dict:
        return self.events.usage

    @property
    def first_output_at(self) -> float | None:
        return self.events.first_output_at

    def __call__(self, chunk: bytes):
        if chunk and self.first_chunk_at is None:
            self.first_chunk_at = time.time()
        self.events.feed(chunk)
        return self.previous(chunk) if self.previous else chunk


def response_summary(flow: http.HTTPFlow, observer: UsageObserver | None) -> dict:
    request, response = flow.request, flow.response
    summary: dict[str, Any] = {"status": response.status_code if response else None}
    if flow.error:
        summary["error"] = flow.error.msg
    if response is None:
        return summary
    usage: dict = {}
    first_output = None  # unknown for an answer that came in one piece
    answer = None  # a Responses answer's response object
    if observer is not None:
        usage, answer = observer.usage, observer.events.response
        first_body_byte, first_output = observer.first_chunk_at, observer.first_output_at
    else:
        if response.content and "json" in response.headers.get("content-type", ""):
            payload = json_or_text(response.content)[1]
            merge_usage(usage, payload)
            answer = payload if isinstance(payload, dict) and payload.get("object") == "response" else None
        first_body_byte = response.timestamp_start
    summary.update(
        content_type=response.headers.get("content-type"),
        streamed=observer is not None,
        usage=usage or None,
        time_to_headers_s=_seconds(request.timestamp_end, response.timestamp_start),
        ttfb_s=_seconds(request.timestamp_end, first_body_byte),
        ttft_s=_seconds(request.timestamp_end, first_output),
        total_s=_seconds(request.timestamp_start, response.timestamp_end),
    )
    if api_of(request) == "responses" and answer is not None:
        summary.update(response_id=answer.get("id"), output=answer.get("output"))
    return summary


def _seconds(start: float | None, end: float | None) -> float | None:
    return round(end - start, 4) if start is not None and end is not None else None


def make_private_dirs(path: Path) -> None:
    """Create `path` and any missing parents 0700; folders that exist keep their modes."""
    missing = [folder for folder in (path, *path.parents) if not folder.exists()]
    for folder in reversed(missing):
        folder.mkdir(mode=PRIVATE_DIR_MODE, exist_ok=True)
        folder.chmod(PRIVATE_DIR_MODE)  # mkdir's mode passes through the umask


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` (0600) through a temporary file, so a reader never sees half a record."""
    temporary = path.with_suffix(".tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE_MODE)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        os.fchmod(file.fileno(), PRIVATE_FILE_MODE)  # an older temporary file keeps its mode otherwise
        file.write(text)
    temporary.replace(path)


def lane_file_name(seq: int, lane: str) -> str:
    return f"{seq:04d}-{lane.replace(':', '-').replace('/', '-')}.json"


class Capture:
    def __init__(self) -> None:
        self.seq = 0
        self.session_dir = Path.cwd() / DEFAULT_CAPTURE_DIR / time.strftime("%Y%m%d-%H%M%S")  # until configure() says otherwise
        self.written = 0
        # Kept here, not in flow.metadata, which must stay serializable (`mitmdump -w`).
        self.observers: dict[str, UsageObserver] = {}
        self.diagnosis = PrefixDiagnosis()  # used only when strip_billing is not loaded
        self.chains = ResponseChains()  # likewise: Responses histories behind previous_response_id

    def load(self, loader) -> None:
        loader.add_option("capture_dir", str, "", f"Where capture sessions go (default: {DEFAULT_CAPTURE_DIR} in the working directory).")
        loader.add_option("capture_session", str, "", "Name of this session's folder (default: the start time, YYYYmmdd-HHMMSS).")
        exposure.declare_option(loader)

    def configure(self, updated) -> None:
        if "capture_dir" in updated or "capture_session" in updated:
            root = (Path(ctx.options.capture_dir).expanduser() if ctx.options.capture_dir else DEFAULT_CAPTURE_DIR).absolute()
            if root.exists() and not root.is_dir():
                raise exceptions.OptionsError(f"capture_dir={ctx.options.capture_dir!r}: exists and is not a directory")
            session = ctx.options.capture_session
            if session and (os.sep in session or session in (".", "..")):
                raise exceptions.OptionsError(f"capture_session={session!r}: must be a plain folder name")
            self.session_dir = root / (session or time.strftime("%Y%m%d-%H%M%S"))
            self.seq = 0

    def running(self) -> None:
        exposure.warn_if_exposed(ctx.options)

    def request(self, flow: http.HTTPFlow) -> None:
        if api_of(flow.request) is None:
            return
        self.seq += 1
        # If strip_billing runs after us, this is still the client's body.
        flow.metadata[CAPTURE_NOTES] = {"seq": self.seq, "client_body": flow.request.get_content(strict=False)}

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        notes = flow.metadata.get(CAPTURE_NOTES)
        response = flow.response
        if notes is None or response is None or not response.headers.get("content-type", "").startswith("text/event-stream"):
            return
        self.observers[flow.id] = response.stream = UsageObserver(response.stream)

    def response(self, flow: http.HTTPFlow) -> None:
        self._write(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._write(flow)

    def done(self) -> None:
        if self.written:
            logger.info(f"capture: {self.written} request(s) written to {self.session_dir}")

    def _write(self, flow: http.HTTPFlow) -> None:
        notes = flow.metadata.get(CAPTURE_NOTES)
        if notes is None or notes.get("written"):
            return
        notes["written"] = True
        record = self.record(flow, notes)
        path = self.session_dir / lane_file_name(notes["seq"], record["lane"])
        try:
            make_private_dirs(path.parent)
            write_private(path, json.dumps(record, ensure_ascii=False, indent=1))
        except OSError as error:
            logger.error(f"capture: cannot write {path} ({error}); the request itself was not affected")
            return
        if self.written == 0:
            logger.info(f"capture: writing to {self.session_dir}")
        self.written += 1

    def record(self, flow: http.HTTPFlow, notes: dict) -> dict:
        stripped = flow.metadata.get(FLOW_NOTES, {})
        client_content = stripped.get("client_body", notes["client_body"])
        forwarded_content = flow.request.get_content(strict=False)
        client_key, client_body = json_or_text(client_content)
        forwarded_key, forwarded_body = json_or_text(forwarded_content)
        api = api_of(flow.request)
        lane, diagnosis = stripped.get("lane"), stripped.get("diagnosis")
        summary = response_summary(flow, self.observers.pop(flow.id, None))
        if lane is None and isinstance(client_body, dict) and isinstance(forwarded_body, dict):
            resolve = self.chains.resolved if api == "responses" else (lambda body: body)
            result = self.diagnosis.observe(PromptSnapshot.of(resolve(client_body), api, flow.request.headers), resolve(forwarded_body))
            lane, diagnosis = result.lane, result.to_json()
            if api == "responses" and summary.get("status") == 200:
                self.chains.remember(forwarded_body, {"id": summary.get("response_id"), "output": summary.get("output")})
        return {
            "format": RECORD_FORMAT,
            "session": self.session_dir.name,
            "seq": notes["seq"],
            "lane": lane or "unknown",
            "request": {
                "method": flow.request.method,
                "path": flow.request.path,
                "api": api,
                "headers": redacted_headers(flow.request.headers),
            },
            f"client_{client_key}": client_body,
            f"forwarded_{forwarded_key}": forwarded_body,
            "changes": stripped.get("changes", []),
            "diagnosis": diagnosis,
            "response": summary,
        }


addons = [Capture()]
