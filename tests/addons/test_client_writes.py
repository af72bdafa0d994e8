"""The one seam over what mitmproxy writes to a client (`addons/client_writes.py`): its handlers in their stated order.

The handlers here are stand-ins that note what they saw; the real ones (the stream recovery, the error answers) are
tested through a real mitmdump in test_engine_errors.py, test_stream_cuts_end_to_end.py and test_stream_recovery.py.
"""

import pytest
from mitmproxy.proxy.layers.http._http1 import Http1Server

from stable_prefix.addons import client_writes


@pytest.fixture
def seen(monkeypatch):
    """What each handler and mitmproxy's own writer were given, in order; the seam's handlers restored afterwards."""
    seen = []
    monkeypatch.setattr(client_writes, "_handlers", {})

    def mitmproxy_send(server, event):
        seen.append(("mitmproxy", event))
        yield f"mitmproxy wrote {event}"

    client_writes.install()
    monkeypatch.setattr(client_writes, "_mitmproxy_send", mitmproxy_send)
    return seen


def passing(name, seen):
    def handler(server, event, rest):
        seen.append((name, event))
        return None

    return handler


def test_every_handler_is_asked_in_the_stated_order_whatever_order_they_registered_in(seen):
    client_writes.register("engine_errors", passing("engine_errors", seen))
    client_writes.register("stream_recovery", passing("stream_recovery", seen))
    written = list(Http1Server.send(object(), "the failure"))
    assert [name for name, _ in seen] == ["stream_recovery", "engine_errors", "mitmproxy"]
    assert written == ["mitmproxy wrote the failure"]


def test_a_handler_that_takes_the_event_writes_through_the_handlers_after_it(seen):
    def recovery(server, event, rest):
        def completes():
            yield "a spliced event"
            yield from rest(server, "the end of the body")

        return completes()

    client_writes.register("stream_recovery", recovery)
    client_writes.register("engine_errors", passing("engine_errors", seen))
    written = list(Http1Server.send(object(), "the cut"))
    assert written == ["a spliced event", "mitmproxy wrote the end of the body"]
    assert seen == [("engine_errors", "the end of the body"), ("mitmproxy", "the end of the body")]


def test_a_script_loaded_again_replaces_its_handler_and_the_seam_stays_one(seen):
    client_writes.register("engine_errors", passing("engine_errors", seen))
    client_writes.register("engine_errors", passing("engine_errors again", seen))  # mitmproxy reloads a changed script
    client_writes.install()
    list(Http1Server.send(object(), "the failure"))
    assert [name for name, _ in seen] == ["engine_errors again", "mitmproxy"]


def test_a_handler_with_no_place_in_the_order_is_refused_naming_it():
    with pytest.raises(ValueError, match="'retry'"):
        client_writes.register("retry", lambda server, event, rest: None)
