"""A replica of a chat completion server in a process of its own, to freeze (SIGSTOP) or kill mid-reply.

    python -m tests.support.chat_replica --port N [--answer-id first] [--event-delay 0.05] [--cuts-on-request]

Every streamed `POST /v1/chat/completions` gets the recorded answer (`recorded_streams.chat_stream`: thinking,
text with multi-byte characters, a tool call), one event per write with `--event-delay` seconds between
them, as an engine streams; a request that is not streamed gets a one-token completion with its usage.
With `--cuts-on-request`, a request's `x-test-cut-at-byte: B` header makes it die as a replica losing power
does, at byte B of the answer, wherever that falls (inside an event, inside a character): the bytes before it
written, the connection then closed with no end of the chunked body. A test freezes it with SIGSTOP: the connection stays open and nothing more comes, as from
a Mac that went to sleep.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from stable_prefix.addons.sse_events import SSEParser
from stable_prefix.servers import LOOPBACK
from tests.support.recorded_streams import PROMPT_TOKENS, Ids, chat_stream


def handler(answer: bytes, event_delay: float, cuts_on_request: bool) -> type[BaseHTTPRequestHandler]:
    events = [event.raw for event in SSEParser().feed(answer)]

    class Replica(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format, *args):  # noqa: A002 - the standard library's signature
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
            if not body.get("stream"):
                data = json.dumps({"id": "chatcmpl-count", "object": "chat.completion", "model": "tiny",
                                   "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": "length"}],
                                   "usage": {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": 1, "total_tokens": PROMPT_TOKENS + 1}}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            cut_at_byte = int(self.headers["x-test-cut-at-byte"]) if cuts_on_request and "x-test-cut-at-byte" in self.headers else None
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            sent = 0
            for index, event in enumerate(events):
                if index:
                    time.sleep(event_delay)
                if cut_at_byte is not None and sent + len(event) > cut_at_byte:
                    self.chunk(event[: cut_at_byte - sent])
                    self.die()
                    return
                self.chunk(event)
                sent += len(event)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def chunk(self, data: bytes) -> None:
            if data:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

        def die(self) -> None:
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True

    return Replica


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--answer-id", default="first", help="the id its answers carry (each replica draws its own)")
    parser.add_argument("--event-delay", type=float, default=0.05)
    parser.add_argument("--cuts-on-request", action="store_true", help="die at the byte a request's x-test-cut-at-byte header names")
    args = parser.parse_args()
    answer = chat_stream(Ids(answer=args.answer_id, call=args.answer_id))
    server = ThreadingHTTPServer((LOOPBACK, args.port), handler(answer, args.event_delay, args.cuts_on_request))
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
