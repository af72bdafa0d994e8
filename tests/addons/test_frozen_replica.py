"""A replica that freezes mid-reply (SIGSTOP: a Mac asleep, a network partition) is taken for cut after `stall_timeout`
seconds without a byte, and the answer is completed on the survivor.

Real processes: two replicas (`tests/support/chat_replica.py`), a router before them that fails over
(`failover_relay.py`: the first request to the first replica, the proxy's recovery to the survivor), and a real
mitmdump with our addons and `stall_timeout=2`. The first replica is stopped with SIGSTOP once the client has
read part of the answer: its connection stays open and nothing more comes, which only the stall timeout notices.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time

import pytest
import requests
from mitmproxy import exceptions
from mitmproxy.test import tutils

from stable_prefix.addons.sse_events import SSEParser, carries_output
from stable_prefix.addons.stream_recovery import (
    RECOVERED_NOTE,
    TEAM_STALL_TIMEOUT_S,
    UpstreamAnswer,
    UpstreamBroke,
    parse_stall_timeout,
    read_limit_s,
    recovered_in_log,
)
from stable_prefix.stack import TEAM_PROXY_OPTIONS
from tests.support.failover_relay import failover_relay
from tests.support.processes import free_port, mitmdump_command, running
from tests.support.recorded_streams import answer_of_chat, chat_stream

STALL_TIMEOUT_S = 2
EVENTS_BEFORE_THE_FREEZE = 4
REQUEST = {"model": "tiny", "messages": [{"role": "user", "content": "Read the file."}], "stream": True,
           "stream_options": {"include_usage": True}, "max_tokens": 100, "temperature": 0}


def test_a_team_proxy_cuts_a_replica_silent_for_five_minutes_and_a_single_engines_never():
    assert TEAM_PROXY_OPTIONS["stall_timeout"] == str(TEAM_STALL_TIMEOUT_S) == "300"
    assert parse_stall_timeout(0) == 0 and read_limit_s(0) == 600 and read_limit_s(300) == 300  # reads bounded even when off
    with pytest.raises(exceptions.OptionsError, match="stall_timeout=-1"):
        parse_stall_timeout(-1)


def test_a_recovery_read_from_a_survivor_that_freezes_too_waits_no_longer_than_its_limit():
    """A survivor that sends its answer's head, then nothing: the recovery's read gives up (and it asks again)."""

    async def frozen_after_the_head(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(3600)

    async def read_once() -> None:
        server = await asyncio.start_server(frozen_after_the_head, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            request = tutils.treq(host="127.0.0.1", port=port, method=b"POST", path=b"/v1/chat/completions")
            answer = await UpstreamAnswer.post(request, b"{}", insecure=False, read_limit_s=0.5)
            assert answer.status == 200
            with pytest.raises(UpstreamBroke, match="sent nothing for 0.5 s"):
                await answer.read()
            answer.close()
        finally:
            server.close()

    asyncio.run(asyncio.wait_for(read_once(), 60))


def replica_command(port: int, answer_id: str) -> list[str]:
    return [sys.executable, "-m", "tests.support.chat_replica", "--port", str(port), "--answer-id", answer_id, "--event-delay", "0.1"]


@pytest.mark.server
def test_a_replica_frozen_mid_reply_is_taken_for_cut_and_the_answer_is_completed_on_the_survivor(tmp_path):
    frozen_port, survivor_port, proxy_port = free_port(), free_port(), free_port()
    with contextlib.ExitStack() as stack:
        relay = stack.enter_context(failover_relay([f"http://127.0.0.1:{frozen_port}", f"http://127.0.0.1:{survivor_port}"]))
        frozen = stack.enter_context(running("frozen-replica", replica_command(frozen_port, "frozen"), port=frozen_port, log_dir=tmp_path))
        stack.callback(lambda: frozen.process.poll() is None and os.kill(frozen.process.pid, signal.SIGCONT))  # before it is stopped
        stack.enter_context(running("survivor", replica_command(survivor_port, "survivor"), port=survivor_port, log_dir=tmp_path))
        command = mitmdump_command(["addons/strip_billing.py"], relay.url, proxy_port, {"upstream_model": "tiny", "stall_timeout": STALL_TIMEOUT_S})
        proxy = stack.enter_context(running("proxy", command, port=proxy_port, log_dir=tmp_path))

        received, output_events, stopped_at = b"", 0, None
        parser = SSEParser()
        with requests.post(f"{proxy.url}/v1/chat/completions", json=REQUEST, stream=True, timeout=120) as response:
            for chunk in response.iter_content(chunk_size=None):
                received += chunk
                output_events += sum(carries_output(event.json()) for event in parser.feed(chunk))
                if stopped_at is None and output_events >= EVENTS_BEFORE_THE_FREEZE:
                    os.kill(frozen.process.pid, signal.SIGSTOP)
                    stopped_at = time.monotonic()
        whole_after = time.monotonic() - stopped_at
        log = proxy.log_text()

    answer, uncut = answer_of_chat(received), answer_of_chat(chat_stream())
    assert relay.routed == [f"http://127.0.0.1:{frozen_port}", f"http://127.0.0.1:{survivor_port}"], "the recovery went to the survivor"
    assert (answer.reasoning, answer.content, answer.usage, answer.finish_reasons) == (uncut.reasoning, uncut.content, uncut.usage, uncut.finish_reasons)
    assert answer.ids == {"chatcmpl-frozen"} and answer.roles == 1 and answer.done == 1 and answer.errors == []
    assert [arguments for _, _, arguments in answer.calls.values()] == [arguments for _, _, arguments in uncut.calls.values()]
    assert f"stall_timeout: the upstream sent nothing for {STALL_TIMEOUT_S} s" in log and RECOVERED_NOTE in log
    (seconds,) = recovered_in_log(log).values()
    print(json.dumps({"stall_timeout_s": STALL_TIMEOUT_S, "from_the_freeze_to_the_whole_answer_s": round(whole_after, 2),
                      "from_the_cut_to_the_whole_answer_s": seconds}))
    assert whole_after >= STALL_TIMEOUT_S
