"""A replica that dies inside an event (inside a multi-byte character, inside a tool call's JSON) through a real mitmdump:
the OpenAI SDK reads one chat completion, equal to the uncut one.

Real processes: a replica that dies at the byte a request names (`tests/support/chat_replica.py`), a survivor,
a router before them that fails over (`failover_relay.py`), and mitmdump with our addons. The every-byte sweep
of the same recovery, without processes, is `test_stream_cuts_every_byte.py`.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time

import openai
import pytest

from stable_prefix.addons.stream_recovery import RECOVERED_NOTE
from tests.support.failover_relay import failover_relay
from tests.support.processes import free_port, mitmdump_command, running
from tests.support.recorded_streams import answer_of_chat, chat_stream

UNCUT = chat_stream()
# Inside the 3-byte character of a text event, and inside a tool call's arguments (an escaped quote of its JSON).
CUTS = {"inside-a-character": UNCUT.index("日".encode()) + 1, "inside-a-tool-calls-json": UNCUT.index(b'src/') + 2}


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    logs = tmp_path_factory.mktemp("replicas")
    dying, survivor = free_port(), free_port()
    with contextlib.ExitStack() as stack:
        for port, name, extra in ((dying, "dying", ["--cuts-on-request"]), (survivor, "survivor", [])):
            command = [sys.executable, "-m", "tests.support.chat_replica", "--port", str(port), "--answer-id", name, "--event-delay", "0", *extra]
            stack.enter_context(running(name, command, port=port, log_dir=logs))
        yield [f"http://127.0.0.1:{dying}", f"http://127.0.0.1:{survivor}"]


@pytest.mark.server
@pytest.mark.parametrize("cut", CUTS.values(), ids=CUTS.keys())
def test_a_replica_dying_inside_an_event_leaves_the_openai_sdk_one_whole_completion(replicas, tmp_path, cut):
    with failover_relay(replicas) as relay:
        port = free_port()
        with running("proxy", mitmdump_command(["addons/strip_billing.py"], relay.url, port, {"upstream_model": "tiny"}), port=port, log_dir=tmp_path) as proxy:
            client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-test", max_retries=0)
            chunks = list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Read the file."}], max_tokens=100,
                                                         stream=True, stream_options={"include_usage": True},
                                                         extra_headers={"x-test-cut-at-byte": str(cut)}))
            # The completion's log line may follow the body's end by a moment: wait for it, bounded.
            deadline = time.monotonic() + 30
            while RECOVERED_NOTE not in (log := proxy.log_text()) and time.monotonic() < deadline:
                time.sleep(0.2)
    uncut = answer_of_chat(UNCUT)
    content = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    arguments = "".join(call.function.arguments or "" for chunk in chunks if chunk.choices for call in chunk.choices[0].delta.tool_calls or [])
    assert relay.routed == replicas, "cut once, then completed by the survivor"
    assert content == uncut.content and arguments == uncut.calls[0][2]
    assert {chunk.id for chunk in chunks} == {"chatcmpl-dying"} and chunks[-1].usage.total_tokens == uncut.usage["total_tokens"]
    assert RECOVERED_NOTE in log and "bytes of an unfinished event dropped" in log


@pytest.mark.server
def test_the_capture_record_of_a_stream_the_proxy_completed_says_so(replicas, tmp_path):
    captures = tmp_path / "captures"
    with failover_relay(replicas) as relay:
        port = free_port()
        options = {"upstream_model": "tiny", "capture_dir": captures, "capture_session": "cut"}
        command = mitmdump_command(["addons/strip_billing.py", "addons/capture.py"], relay.url, port, options)
        with running("proxy", command, port=port, log_dir=tmp_path) as proxy:
            client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-test", max_retries=0)
            list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Read the file."}], max_tokens=100,
                                                stream=True, stream_options={"include_usage": True},
                                                extra_headers={"x-test-cut-at-byte": str(CUTS["inside-a-character"])}))
    (record,) = [json.loads(path.read_text()) for path in (captures / "cut").glob("*.json")]
    response = record["response"]
    assert "error" not in response and response["status"] == 200
    assert response["completed_by_proxy"]["how"] == "replay" and "peer closed connection" in response["completed_by_proxy"]["cut"]
    assert response["usage"] == answer_of_chat(UNCUT).usage
