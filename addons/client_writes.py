"""The one seam over what mitmproxy writes to a client: `Http1Server.send`, with an ordered list of handlers.

mitmproxy has no hook for a failed forward or a broken-off stream, only the
`error` hook after the fact; the client's side is then written by its HTTP/1
server layer (`Http1Server.send`, given a `ResponseProtocolError`), which
writes an HTML page or closes the connection. Two addons change what goes out
there: `stream_recovery.py` completes a broken-off chat stream, and
`engine_errors.py` answers the rest in the protocol's shape. `install()`
replaces that one method once per process (mitmproxy is pinned; a script
loaded again finds it replaced) with a dispatch over the handlers registered,
in the order `ORDER` states, whichever addon loads first.

A handler is `(server, event, rest) -> commands or None`: None leaves the
event to the next handler (and after the last, to mitmproxy); else its
commands are what goes out. `rest(server, event)` sends through the handlers
after it, so a recovery that gives up writes its error event through
`engine_errors`, and its spliced chunks through mitmproxy's own writer.
"""

from __future__ import annotations

from collections.abc import Callable

from mitmproxy.proxy.layer import CommandGenerator
from mitmproxy.proxy.layers.http import HttpEvent
from mitmproxy.proxy.layers.http._http1 import Http1Server

Send = Callable[[Http1Server, HttpEvent], CommandGenerator[None]]
Handler = Callable[[Http1Server, HttpEvent, Send], CommandGenerator[None] | None]

# First the recovery (it may complete a stream), then the error answers (what is not recovered).
ORDER = ("stream_recovery", "engine_errors")

_handlers: dict[str, Handler] = {}
_mitmproxy_send: Send | None = None


def register(name: str, handler: Handler) -> None:
    """Add (or replace, for a script loaded again) the handler of that name, and install the seam."""
    if name not in ORDER:
        raise ValueError(f"client_writes: no place for a handler named {name!r} (the order is {', '.join(ORDER)})")
    _handlers[name] = handler
    install()


def install() -> None:
    """Replace `Http1Server.send` by the dispatch, once per process."""
    global _mitmproxy_send
    if Http1Server.send is not _dispatch:
        _mitmproxy_send = Http1Server.send
        Http1Server.send = _dispatch


def _dispatch(server: Http1Server, event: HttpEvent) -> CommandGenerator[None]:
    yield from _send_from(0, server, event)


def _send_from(position: int, server: Http1Server, event: HttpEvent) -> CommandGenerator[None]:
    for index in range(position, len(ORDER)):
        handler = _handlers.get(ORDER[index])
        taken = handler(server, event, _rest_after(index)) if handler is not None else None
        if taken is not None:
            yield from taken
            return
    yield from _mitmproxy_send(server, event)


def _rest_after(index: int) -> Send:
    def rest(server: Http1Server, event: HttpEvent) -> CommandGenerator[None]:
        return _send_from(index + 1, server, event)

    return rest
