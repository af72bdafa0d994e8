"""The proxy restarted mid-session, and two proxies on one capture folder: real mitmdump processes.

Captures continue where the session left off and no record replaces another;
the restarted proxy says its prefix diagnosis starts fresh.
"""

from __future__ import annotations

import contextlib
import json

import pytest

from tests.support.llm_client import send
from tests.support.processes import free_port, mitmdump_command, running
from tests.support.slow_sse_upstream import slow_sse_upstream

pytestmark = pytest.mark.server


def turn(turns: int) -> dict:
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"} for i in range(turns * 2 - 1)]
    return {"model": "m", "max_tokens": 10, "system": "You code.", "messages": messages}


@contextlib.contextmanager
def proxy(upstream, captures, logs, session: str = "fixed"):
    port = free_port()
    command = mitmdump_command(["addons/strip_billing.py", "addons/capture.py"], upstream.url, port,
                               {"capture_dir": captures, "capture_session": session})
    with running("mitmdump", command, port=port, log_dir=logs, startup_timeout=60) as server:
        yield server


def records(folder) -> list[dict]:
    return sorted((json.loads(path.read_text()) for path in folder.glob("*.json")), key=lambda record: record["seq"])


def test_a_restarted_proxy_continues_the_session_and_says_the_diagnosis_starts_fresh(tmp_path):
    with slow_sse_upstream(event_delay=0.01) as upstream:
        with proxy(upstream, tmp_path / "captures", tmp_path / "first") as first:
            send(first.url, "/v1/messages", turn(1))
            send(first.url, "/v1/messages", turn(2))
        with proxy(upstream, tmp_path / "captures", tmp_path / "second") as second:
            send(second.url, "/v1/messages", turn(3))
            send(second.url, "/v1/messages", turn(4))
        log = second.log_text()
    found = records(tmp_path / "captures" / "fixed")
    assert [record["seq"] for record in found] == [1, 2, 3, 4]
    assert [len(record["client_body"]["messages"]) for record in found] == [1, 3, 5, 7]
    assert [record["diagnosis"]["request_in_lane"] for record in found] == [1, 2, 1, 2]  # the restart started fresh
    assert "already holds records up to #2: continuing at #3, none is replaced. The prefix diagnosis starts fresh" in log


def test_two_proxies_writing_one_session_folder_at_once_keep_every_record(tmp_path):
    with slow_sse_upstream(event_delay=0.01) as upstream:
        with proxy(upstream, tmp_path / "captures", tmp_path / "a") as one, proxy(upstream, tmp_path / "captures", tmp_path / "b") as two:
            for turns in range(1, 4):
                send(one.url, "/v1/messages", turn(turns))
                send(two.url, "/v1/messages", turn(turns))
    found = records(tmp_path / "captures" / "fixed")
    assert [record["seq"] for record in found] == [1, 2, 3, 4, 5, 6]
    assert sorted(len(record["client_body"]["messages"]) for record in found) == [1, 1, 3, 3, 5, 5]
