"""Record every agent API request, for `python -m stable_prefix.captures diff|report`.

    mitmdump -s addons/strip_billing.py -s addons/capture.py --mode reverse:http://127.0.0.1:8000 \
        --listen-host 127.0.0.1 -p 8080

Writes `<capture_dir>/<session>/NNNN-<lane>.json` for each `POST /v1/messages`,
`POST /v1/chat/completions` and `POST /v1/responses` (nothing for other flows):
method, path, headers as the client sent them with credentials redacted (the routing key that replaced some beside them), the body as the client sent it
and as it was forwarded, the changes and prefix diagnosis (from strip_billing.py's addons, the one
diagnosis: loaded alone, capture records none and names the lane `unknown`), and a response
summary: status, usage (incl. `cache_read_input_tokens` /
`prompt_tokens_details.cached_tokens` / `input_tokens_details.cached_tokens`),
llama.cpp's `timings` (`cache_n` reused, `prompt_n` prefilled; the last a stream sent),
time to headers, to the first body byte, to the first generated output (streamed
answers), and total; for the Responses API also the response's id and output
items (what the server holds for a later `previous_response_id`). Streamed answers are
observed as they pass, never buffered. Works alone or with strip_billing in
either order: the record is written when the response (or error) is complete.

Records hold the user's code and prompts: files are created 0600, the folders
this addon creates 0700. The default folder is `captures/sessions` under the
directory mitmdump was started in, never inside the installed package. No
record ever replaces another (`capture_folder.py`: a restarted proxy continues
its session's numbering, two proxies never share a default session folder),
and the folder is kept within a budget (`capture_budget.py`: 2 GB and 14 days
by default, the least recently written sessions removed first, each removal
logged). A record that cannot be written is logged; the request is never
affected.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mitmproxy import ctx, exceptions, http
from mitmproxy.utils import human

from stable_prefix.addons import exposure
from stable_prefix.addons.capture_budget import AGE_OPTION, BYTES_OPTION, Budget, enforce
from stable_prefix.addons.capture_folder import claim_new_session, last_record_number, record_file_name, write_private, write_record
from stable_prefix.addons.flow_notes import CLIENT_ROUTING_HEADERS, FLOW_NOTES, client_headers
from stable_prefix.addons.request_body import UnreadableJson, api_of, parse_json, utf8_json
from stable_prefix.addons.sse_events import EventStream, merge_usage
from stable_prefix.usage import timings_in

logger = logging.getLogger(__name__)

RECORD_FORMAT = "stable-prefix capture 1"
# Relative: resolved against the working directory when the options are read.
DEFAULT_CAPTURE_DIR = Path("captures", "sessions")
DEFAULT_MAX_BYTES = "2g"  # mitmproxy's size syntax, as its own body_size_limit
DEFAULT_MAX_AGE_DAYS = 14
# How often a running proxy looks for sessions past the age limit.
AGE_CHECK_INTERVAL_S = 3600.0
REDACTED = "[redacted]"
SECRET_HEADERS = frozenset({"x-api-key", "authorization", "proxy-authorization", "cookie", "set-cookie", "anthropic-api-key"})
CAPTURE_NOTES = "capture"
COMPLETED_NOTES = "completed_by_proxy"  # stream_recovery's note of a broken-off stream it completed (its hook, stream_recovered)
# Streams cut by the upstream whose record may yet say the proxy completed them (stream_recovery's hook): the latest ones.
CUT_STREAMS_KEPT = 64


def redacted_headers(headers: http.Headers) -> dict[str, str]:
    result: dict[str, str] = {}
    for name, value in headers.items(multi=True):
        name = name.lower()
        value = REDACTED if name in SECRET_HEADERS else value
        result[name] = f"{result[name]}, {value}" if name in result else value
    return result


def json_or_text(content: bytes | None) -> tuple[str, Any]:
    """("body", parsed JSON) or ("body_text", text) for a body the addons do not read as JSON."""
    try:
        return "body", parse_json(content or b"")
    except UnreadableJson:
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
    timings = None  # llama.cpp's, beside its usage
    first_output = None  # unknown for an answer that came in one piece
    answer = None  # a Responses answer's response object
    if observer is not None:
        usage, answer, timings = observer.usage, observer.events.response, observer.events.timings
        first_body_byte, first_output = observer.first_chunk_at, observer.first_output_at
    else:
        if response.content and "json" in response.headers.get("content-type", ""):
            payload = json_or_text(response.content)[1]
            merge_usage(usage, payload)
            timings = timings_in(payload)
            answer = payload if isinstance(payload, dict) and payload.get("object") == "response" else None
        first_body_byte = response.timestamp_start
    summary.update(
        content_type=response.headers.get("content-type"),
        streamed=observer is not None,
        usage=usage or None,
        **({"timings": timings} if timings else {}),
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


def encode_record(record: dict) -> bytes:
    return utf8_json(json.dumps(record, ensure_ascii=False, indent=1))


def session_name_now() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


def parse_budget(options) -> Budget:
    """The budget as the options set it; raises OptionsError naming a bad value."""
    try:
        max_bytes = human.parse_size(options.capture_max_bytes.strip())
    except ValueError:
        raise exceptions.OptionsError(
            f"{BYTES_OPTION}={options.capture_max_bytes!r}: not a size (examples: 2g, 500m, 0 for no limit)") from None
    if max_bytes is None or max_bytes < 0:
        raise exceptions.OptionsError(f"{BYTES_OPTION}={options.capture_max_bytes!r}: must be 0 (no limit) or a size such as 2g")
    if options.capture_max_age_days < 0:
        raise exceptions.OptionsError(f"{AGE_OPTION}={options.capture_max_age_days}: must be 0 (no limit) or a number of days")
    return Budget(max_bytes=max_bytes, max_age_days=options.capture_max_age_days)


class Capture:
    def __init__(self) -> None:
        self.root = Path.cwd() / DEFAULT_CAPTURE_DIR  # until configure() says otherwise
        self.default_session = session_name_now()
        self.session_dir: Path | None = None  # claimed at the first record unless capture_session names it
        self.seq = 0
        self.written = 0
        self.budget = Budget()
        self.stored_bytes: int | None = None  # at the last budget check, plus what was written since
        self.age_checked_at = 0.0
        self.pruning: threading.Thread | None = None
        # Kept here, not in flow.metadata, which must stay serializable (`mitmdump -w`).
        self.observers: dict[str, UsageObserver] = {}
        self.cut_streams: dict[str, UsageObserver] = {}  # by flow id: streams cut, still observed while the proxy completes them

    def load(self, loader) -> None:
        loader.add_option("capture_dir", str, "", f"Where capture sessions go (default: {DEFAULT_CAPTURE_DIR} in the working directory).")
        loader.add_option(
            "capture_session", str, "",
            "Name of this session's folder; records continue after those it holds (default: the start time, YYYYmmdd-HHMMSS, "
            "with -2, -3... when another proxy has that folder).",
        )
        loader.add_option(
            BYTES_OPTION, str, DEFAULT_MAX_BYTES,
            "What the sessions under capture_dir may hold, e.g. 2g, 500m; the least recently written go first. 0: no limit.",
        )
        loader.add_option(AGE_OPTION, int, DEFAULT_MAX_AGE_DAYS, "Remove sessions last written more than this many days ago. 0: no limit.")
        exposure.declare_option(loader)

    def configure(self, updated) -> None:
        if "capture_dir" in updated or "capture_session" in updated:
            root = (Path(ctx.options.capture_dir).expanduser() if ctx.options.capture_dir else DEFAULT_CAPTURE_DIR).absolute()
            if root.exists() and not root.is_dir():
                raise exceptions.OptionsError(f"capture_dir={ctx.options.capture_dir!r}: exists and is not a directory")
            session = ctx.options.capture_session
            if session and (os.sep in session or session in (".", "..")):
                raise exceptions.OptionsError(f"capture_session={session!r}: must be a plain folder name")
            self.root = root
            self.session_dir = root / session if session else None
            self.seq = last_record_number(self.session_dir) if self.session_dir else 0
            if self.seq:
                logger.info(f"capture: {self.session_dir} already holds records up to #{self.seq}: continuing at #{self.seq + 1}, "
                            "none is replaced. The prefix diagnosis starts fresh: each lane's next request is diagnosed as its first.")
        if BYTES_OPTION in updated or AGE_OPTION in updated:
            self.budget = parse_budget(ctx.options)

    def running(self) -> None:
        exposure.warn_if_exposed(ctx.options)
        self.check_budget()

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

    def stream_recovered(self, flow: http.HTTPFlow) -> None:
        """stream_recovery completed this flow's stream after the upstream cut it, when its record (written at the cut)
        showed the cut: the record now says the answer came whole, with its usage, and how it was completed."""
        notes, observer = flow.metadata.get(CAPTURE_NOTES) or {}, self.cut_streams.pop(flow.id, None)
        completed = flow.metadata.get(COMPLETED_NOTES)
        if not notes.get("record_path") or observer is None or not isinstance(completed, dict):
            return
        path = Path(notes["record_path"])
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            response = {**record["response"], **response_summary(flow, observer), "total_s": _seconds(flow.request.timestamp_start, time.time())}
            response.pop("error", None)  # the cut, now under completed_by_proxy
            response["completed_by_proxy"] = {**completed, "cut": flow.error.msg if flow.error else completed.get("cut")}
            write_private(path, encode_record({**record, "response": response}).decode("utf-8"))
        except (OSError, ValueError, KeyError) as error:
            logger.error(f"capture: {path} still shows the cut of a stream the proxy completed ({error})")

    def _keep_cut(self, flow_id: str, observer: UsageObserver) -> None:
        # What its parser holds is half an event the upstream never finished; what comes next (spliced) starts whole.
        observer.events.parser.finish()
        self.cut_streams[flow_id] = observer
        while len(self.cut_streams) > CUT_STREAMS_KEPT:
            del self.cut_streams[next(iter(self.cut_streams))]

    def done(self) -> None:
        if self.written:
            logger.info(f"capture: {self.written} request(s) written to {self.session_dir}")

    def check_budget(self) -> None:
        """Remove what is over the budget (`capture_budget.enforce`), saying what went, in a thread:
        scanning a full folder takes a while, and requests must not wait for it."""
        if not self.budget.limited or (self.pruning is not None and self.pruning.is_alive()):
            return
        self.age_checked_at = time.time()
        self.pruning = threading.Thread(target=self._enforce_budget, args=(self.session_dir, self.age_checked_at), name="capture-budget", daemon=True)
        self.pruning.start()

    def _enforce_budget(self, current: Path | None, now: float) -> None:
        try:
            lines, self.stored_bytes = enforce(self.root, current, self.budget, now=now)
        except OSError as error:
            logger.error(f"capture: cannot keep {self.root} within its budget ({error}); nothing more is removed until the next check")
            return
        for line in lines:
            logger.info(line)

    def _after_writing(self, size: int) -> None:
        if self.stored_bytes is not None:
            self.stored_bytes += size
        over = self.budget.max_bytes and (self.stored_bytes is None or self.stored_bytes > self.budget.max_bytes)
        due = self.budget.max_age_days and time.time() - self.age_checked_at > AGE_CHECK_INTERVAL_S
        if over or due:
            self.check_budget()

    def _write(self, flow: http.HTTPFlow) -> None:
        notes = flow.metadata.get(CAPTURE_NOTES)
        if notes is None or notes.get("written"):
            return
        notes["written"] = True
        try:
            if self.session_dir is None:
                self.session_dir = claim_new_session(self.root, self.default_session)
            record = self.record(flow, notes)
            seq, size = write_record(self.session_dir, notes["seq"], record["lane"], lambda seq: encode_record({**record, "seq": seq}))
        except (OSError, ValueError, RecursionError) as error:
            logger.error(f"capture: request #{notes['seq']} was not recorded in {self.session_dir} ({error}); the request itself was not affected")
            return
        notes["record_path"] = str(self.session_dir / record_file_name(seq, record["lane"]))
        self.seq = max(self.seq, seq)
        if self.written == 0:
            logger.info(f"capture: writing to {self.session_dir}")
        self.written += 1
        self._after_writing(size)

    def record(self, flow: http.HTTPFlow, notes: dict) -> dict:
        stripped = flow.metadata.get(FLOW_NOTES, {})
        client_content = stripped.get("client_body", notes["client_body"])
        forwarded_content = flow.request.get_content(strict=False)
        client_key, client_body = json_or_text(client_content)
        forwarded_key, forwarded_body = json_or_text(forwarded_content)
        api = api_of(flow.request)
        lane, diagnosis = stripped.get("lane"), stripped.get("diagnosis")
        observer = self.observers.pop(flow.id, None)
        summary = response_summary(flow, observer)
        if flow.error is not None and observer is not None:
            self._keep_cut(flow.id, observer)
        return {
            "format": RECORD_FORMAT,
            "session": self.session_dir.name,
            "seq": notes["seq"],
            "lane": lane or "unknown",
            "request": {
                "method": flow.request.method,
                "path": flow.request.path,
                "api": api,
                # As the client sent them, like client_body; the routing key that replaced some (lane_routing_header) beside.
                "headers": redacted_headers(client_headers(flow)),
                **({"routing_key_headers": {name: flow.request.headers.get(name) for name in flow.metadata[CLIENT_ROUTING_HEADERS]}}
                   if flow.metadata.get(CLIENT_ROUTING_HEADERS) else {}),
            },
            f"client_{client_key}": client_body,
            f"forwarded_{forwarded_key}": forwarded_body,
            "changes": stripped.get("changes", []),
            "answered_by_proxy": stripped.get("answered_by_proxy"),  # why the proxy answered it itself (never forwarded)
            "diagnosis": diagnosis,
            "response": summary,
        }


addons = [Capture()]
