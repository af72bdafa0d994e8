"""A stand-in for Anthropic's API that records every request and answers briefly.

Used to learn what the real Claude Code CLI sends (paths, how many requests a
`claude -p` makes, which models, how large) without a model behind it:

    python tests/support/recording_anthropic_stub.py --port 8123 --record requests.jsonl

`POST /v1/messages` gets a short streamed (SSE) or plain JSON text reply,
`POST /v1/messages/count_tokens` an estimate, anything else an empty 200, so
probes the CLI makes do not fail. Each request is appended to the record file
as one JSON line: method, path, headers (credentials redacted) and the body.
"""

from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from stable_prefix.addons.sse_events import format_event

REPLY_TEXT = "OK."
CREDENTIAL_HEADERS = {"x-api-key", "authorization", "cookie"}



def message_events(model: str, text: str, input_tokens: int) -> list[bytes]:
    usage = {"input_tokens": input_tokens, "output_tokens": 0}
    return [
        format_event({"type": "message_start", "message": {
            "id": "msg_stub", "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": usage}}, "message_start"),
        format_event({"type": "content_block_start", "index": 0,
                                          "content_block": {"type": "text", "text": ""}}, "content_block_start"),
        format_event({"type": "content_block_delta", "index": 0,
                                          "delta": {"type": "text_delta", "text": text}}, "content_block_delta"),
        format_event({"type": "content_block_stop", "index": 0}, "content_block_stop"),
        format_event({"type": "message_delta",
                                    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                    "usage": {"output_tokens": 1}}, "message_delta"),
        format_event({"type": "message_stop"}, "message_stop"),
    ]


class RecordingHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    record_path: Path
    record_lock = threading.Lock()

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - stdlib signature
        pass  # the record file is the log

    def _read_body(self) -> bytes:
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length) if length else b""

    def _record(self, body: bytes) -> dict | None:
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = {"unparsed_bytes": len(body)}
        headers = {k.lower(): ("<redacted>" if k.lower() in CREDENTIAL_HEADERS else v) for k, v in self.headers.items()}
        entry = {"method": self.command, "path": self.path, "headers": headers, "body_bytes": len(body), "body": parsed}
        with self.record_lock, self.record_path.open("a") as record:
            record.write(json.dumps(entry) + "\n")
        return parsed if isinstance(parsed, dict) else None

    def _send_json(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        body = self._read_body()
        request = self._record(body) or {}
        path = self.path.split("?")[0]
        input_tokens = max(1, len(body) // 4)  # a rough estimate is all a stub needs
        if path == "/v1/messages/count_tokens":
            self._send_json(200, {"input_tokens": input_tokens})
        elif path == "/v1/messages":
            model = str(request.get("model", "stub"))
            if request.get("stream"):
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                self.send_header("connection", "close")
                self.end_headers()
                for event in message_events(model, REPLY_TEXT, input_tokens):
                    self.wfile.write(event)
                    self.wfile.flush()
                self.close_connection = True
            else:
                self._send_json(200, {
                    "id": "msg_stub", "type": "message", "role": "assistant", "model": model,
                    "content": [{"type": "text", "text": REPLY_TEXT}], "stop_reason": "end_turn",
                    "stop_sequence": None, "usage": {"input_tokens": input_tokens, "output_tokens": 1}})
        else:
            self._send_json(200, {})

    def do_GET(self) -> None:
        self._record(b"")
        self._send_json(200, {})

    def do_HEAD(self) -> None:
        self._record(b"")
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--record", type=Path, required=True, help="JSON-lines file that receives every request")
    args = parser.parse_args()
    RecordingHandler.record_path = args.record
    ThreadingHTTPServer((args.host, args.port), RecordingHandler).serve_forever()


if __name__ == "__main__":
    main()
