"""A router before replicas, as a team's router fails over: the first request goes to the first replica, every
later one (a resend, the proxy's recovery) to the next, which survives; each answer relayed as it comes.

What it routed is kept (`routed`: the replica's URL for each request, in order), so a test can tell that the
recovery was answered by the survivor. A replica frozen mid-answer holds its relaying thread until the
replica is resumed or killed: stop the replicas before the relay.
"""

from __future__ import annotations

import contextlib
import http.client
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from urllib.parse import urlsplit

from stable_prefix.servers import LOOPBACK, free_port, serving

HOP_HEADERS = frozenset({"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host", "content-length"})


@dataclass
class FailoverRelay:
    replicas: list[str]
    port: int = field(default_factory=free_port)
    routed: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def choose(self) -> str:
        self.routed.append(self.replicas[min(len(self.routed), len(self.replicas) - 1)])
        return self.routed[-1]


def _handler(relay: FailoverRelay) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format, *args):  # noqa: A002 - the standard library's signature
            pass

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            target = urlsplit(relay.choose())
            replica = http.client.HTTPConnection(target.hostname, target.port, timeout=None)
            try:
                replica.request("POST", self.path, body=body, headers={k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS})
                answer = replica.getresponse()
                self.send_response(answer.status)
                for name, value in answer.getheaders():
                    if name.lower() not in HOP_HEADERS:
                        self.send_header(name, value)
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                while data := answer.read1(65536):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except (OSError, http.client.HTTPException):
                self.close_connection = True  # the replica died or the proxy hung up: cut the proxy's side too
                with contextlib.suppress(OSError):
                    self.connection.close()
            finally:
                replica.close()

    return Handler


@contextlib.contextmanager
def failover_relay(replicas: list[str]) -> Iterator[FailoverRelay]:
    relay = FailoverRelay(list(replicas))
    with serving(_handler(relay), relay.port, "failover-relay"):
        yield relay
