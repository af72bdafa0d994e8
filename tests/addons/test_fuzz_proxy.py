"""Fuzz, end to end: bodies of every protocol through a real mitmdump (strip_billing + capture)
into a recording loopback upstream, over HTTP: gzip, deflate and br bodies, chunked uploads.

The same property as in process (tests/addons/test_fuzz_addons.py, which runs many
more examples): what reached the upstream is the client's body byte for byte,
or that body after the documented rules; a body the proxy cannot read passes
untouched with exactly one line in mitmdump's log; every request is answered
and captured once; mitmdump logs no addon error and is still serving at the
end. Then the findings of issue 18 and 10 MB bodies, one request each.
"""

from __future__ import annotations

import http.client
import itertools
import json
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from stable_prefix.addons.request_body import MAX_NESTING
from tests.support.addon_pipeline import MAX_TOKENS_CAP, SERVED_MODEL
from tests.support.forwarding_property import exchange_problems
from tests.support.fuzz_bodies import LONE_SURROGATE, PROTOCOLS, WireRequest, client_json, fuzz
from tests.support.processes import LOOPBACK, Server, free_port, mitmdump_command, running
from tests.support.slow_sse_upstream import Received, SlowUpstream, slow_sse_upstream

pytestmark = pytest.mark.server

EXAMPLES = {"anthropic": 150, "openai": 150, "responses": 60}
TALLY: Counter = Counter()
TEN_MB = 10 * 1024 * 1024


@dataclass
class ProxyUnderTest:
    server: Server
    upstream: SlowUpstream
    session_dir: Path
    tags: itertools.count = field(default_factory=lambda: itertools.count(1))
    log_offset: int = 0
    sent: dict[int, WireRequest] = field(default_factory=dict)

    def send(self, wire: WireRequest) -> tuple[int, Received, list[str]]:
        """Send it with a tag in its path; the upstream's record of it and the log lines naming it."""
        tag = next(self.tags)
        path = wire.protocol.path + ("&" if "?" in wire.protocol.path else "?") + f"fuzz={tag}"
        self.sent[tag] = wire
        connection = http.client.HTTPConnection(LOOPBACK, self.server.port, timeout=120)
        try:
            if wire.chunked:
                pieces = [wire.content[i : i + 4096] for i in range(0, len(wire.content), 4096)] or [b""]
                connection.request("POST", path, body=iter(pieces), headers=dict(wire.headers), encode_chunked=True)
            else:
                connection.request("POST", path, body=wire.content, headers=dict(wire.headers))
            response = connection.getresponse()
            response.read()
            assert response.status == 200, f"#{tag}: HTTP {response.status}"
        finally:
            connection.close()
        [received] = [r for r in self.upstream.received if r.path.endswith(f"fuzz={tag}")]
        return tag, received, self.new_log_lines(f"fuzz={tag}: ")

    def new_log_lines(self, needle: str) -> list[str]:
        text = self.server.log_text()
        lines = [line for line in text[self.log_offset :].splitlines() if needle in line]
        self.log_offset = len(text)
        return lines

    def records_by_tag(self) -> Counter:
        paths = [json.loads(path.read_bytes().decode("utf-8"))["request"]["path"] for path in self.session_dir.glob("*.json")]
        return Counter(int(re.search(r"fuzz=(\d+)", path).group(1)) for path in paths)


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    logs, captures = tmp_path_factory.mktemp("logs"), tmp_path_factory.mktemp("captures")
    with slow_sse_upstream(event_delay=0.001) as upstream:
        port = free_port()
        options = {"upstream_model": SERVED_MODEL, "max_tokens_cap": MAX_TOKENS_CAP, "capture_dir": captures, "capture_session": "fuzz"}
        command = mitmdump_command(["addons/strip_billing.py", "addons/capture.py"], upstream.url, port, options)
        # Unbuffered: each example reads the log lines its request caused.
        with running("mitmdump", command, port=port, log_dir=logs, startup_timeout=60, env={"PYTHONUNBUFFERED": "1"}) as server:
            yield ProxyUnderTest(server, upstream, captures / "fuzz")
            assert server.process.poll() is None, "mitmdump died"
    print("\nfuzz examples through mitmdump: " + ", ".join(f"{key} {count}" for key, count in sorted(TALLY.items())))


def check(proxy: ProxyUnderTest, wire: WireRequest) -> None:
    tag, received, lines = proxy.send(wire)
    assert exchange_problems(wire, received.raw_body, received.headers, served_model=SERVED_MODEL, max_tokens_cap=MAX_TOKENS_CAP) == []
    unreadable = [line for line in lines if line.endswith("passed through unchanged")]
    if wire.protocol.normalized and wire.defect is not None:
        assert len(unreadable) == 1, lines
    else:
        # Valid JSON in a shape the rules do not read (a Responses body without `input`): untouched, said once.
        assert len(unreadable) == 0 or (len(unreadable) == 1 and received.raw_body == wire.content), lines
    outcome = "unreadable" if wire.defect else "changed by the rules" if received.raw_body != wire.content else "byte for byte"
    TALLY[f"{wire.protocol.name} {outcome}{' (chunked)' if wire.chunked else ''}"] += 1


@pytest.mark.parametrize("name", list(PROTOCOLS))
def test_every_body_reaches_the_upstream_as_sent_or_as_the_rules_say(proxy, name):
    fuzz(PROTOCOLS[name], EXAMPLES[name], lambda wire: check(proxy, wire))


# --- the findings of issue 18, and 10 MB bodies --------------------------------------------------

MAIN = {"model": "claude-opus-4-8", "max_tokens": 64000, "stream": True,
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332.a3f; cc_prev_req=req_01; cc_prompt_id=7f; cc_is_subagent=false;"},
                   {"type": "text", "text": "You are a coding agent."}],
        "messages": [{"role": "user", "content": f"fix the emoji {LONE_SURROGATE} cut in half"}]}


def _json_wire(body: dict, headers: tuple[tuple[str, str], ...] = (("content-type", "application/json"),), defect: str | None = None,
               protocol: str = "anthropic", content: bytes | None = None) -> WireRequest:
    return WireRequest(PROTOCOLS[protocol], content if content is not None else client_json(body, "compact"), headers, False, defect, body)


def _ten_megabytes(protocol: str) -> dict:
    paste = "a 10 MB paste line\n" * (TEN_MB // 19)
    if protocol == "anthropic":
        return {**MAIN, "messages": [{"role": "user", "content": paste}]}
    if protocol == "openai":
        return {"model": "gpt-5", "messages": [{"role": "system", "content": "x-anthropic-billing-header: cc_version=1;\nBe brief."},
                                               {"role": "user", "content": paste}]}
    return {"model": "gpt-5-codex", "instructions": "Be brief.", "input": paste}


FINDINGS = {
    "a lone surrogate escape": _json_wire(MAIN),
    "the next turn after a lone surrogate": _json_wire({**MAIN, "messages": [*MAIN["messages"], {"role": "assistant", "content": "done"},
                                                                               {"role": "user", "content": "thanks"}]}),
    "nested past Python's recursion limit": _json_wire(MAIN, defect="nested deep", content=b'{"deep":' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    f"nested {MAX_NESTING} deep, which is read": _json_wire({**MAIN, "deep": json.loads("[" * (MAX_NESTING - 1) + "]" * (MAX_NESTING - 1))}),
    "text/plain": _json_wire(MAIN, (("content-type", "text/plain"),), defect="text/plain"),
    "form-encoded": _json_wire(MAIN, (("content-type", "application/x-www-form-urlencoded"),), defect="form-encoded"),
    "a key twice": _json_wire(MAIN, defect="a key twice", content=b'{"model":"a",' + client_json(MAIN, "compact")[1:]),
    **{f"10 MB, {name}": _json_wire(_ten_megabytes(name), protocol=name) for name in PROTOCOLS},
}


@pytest.mark.parametrize("case", list(FINDINGS))
def test_a_finding_of_issue_18_reaches_the_upstream_as_specified(proxy, case):
    check(proxy, FINDINGS[case])


def test_every_request_was_captured_once_and_no_addon_failed(proxy):
    # Runs after the fuzz examples and findings above (file order): their records, written as each answer ended.
    expected = Counter({tag: 1 for tag, wire in proxy.sent.items() if wire.protocol.normalized})
    deadline = time.monotonic() + 30
    while proxy.records_by_tag() != expected and time.monotonic() < deadline:
        time.sleep(0.2)
    assert proxy.records_by_tag() == expected
    assert not list(proxy.session_dir.glob("*.tmp")) and not list(proxy.session_dir.glob(".*.tmp"))
    log = proxy.server.log_text()
    assert "Addon error" not in log and "Traceback" not in log
    assert proxy.server.process.poll() is None
