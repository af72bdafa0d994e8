"""json_mode_guard: strict json_schema requests become json_object for models that stall on them.

Unit tests call the plain functions and the hook; the end-to-end tests send
through a real mitmdump to a loopback upstream that records what arrives.
"""

from __future__ import annotations

import copy
import json
import urllib.request
from pathlib import Path

import openai
import pytest
from mitmproxy import exceptions
from mitmproxy.test import taddons, tflow, tutils

from stable_prefix.addons import json_mode_guard
from stable_prefix.addons.json_mode_guard import JsonModeGuard, downgrade_json_schema, model_matches, parse_model_patterns
from tests.support.processes import free_port, mitmdump_command, running
from tests.support.sse_upstream import sse_upstream

CODER_MODEL = "mlx-community/Qwen3-Coder-30B-A3B-Instruct-4bit"
DENSE_MODEL = "mlx-community/Qwen2.5-Coder-32B-Instruct-4bit"
TICKET_SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "priority": {"type": "integer", "minimum": 1}},
    "required": ["title", "priority"],
    "additionalProperties": False,
}
DEFAULT_PATTERNS = parse_model_patterns(json_mode_guard.DEFAULT_MODEL_PATTERNS)


def structured_request(model: str = CODER_MODEL, system: object = "You file tickets.") -> dict:
    """What LangChain's `with_structured_output(Ticket)` sends (method="json_schema")."""
    messages = [{"role": "user", "content": "The cache is slow, file it."}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    return {
        "model": model,
        "messages": messages,
        "temperature": 0.2,
        "max_tokens": 300,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "Ticket", "description": "A bug ticket", "schema": TICKET_SCHEMA, "strict": True},
        },
    }


def guidance_schema(text: str) -> dict:
    return json.loads(text[text.index("{") :])


# --- the rewrite ------------------------------------------------------------------


def test_matching_model_gets_json_object_and_the_schema_in_its_system_message():
    body = structured_request()
    change = downgrade_json_schema(body, DEFAULT_PATTERNS)
    assert body["response_format"] == {"type": "json_object"}
    system = body["messages"][0]["content"]
    assert system.startswith("You file tickets.\n\n")
    assert '"Ticket"' in system and "A bug ticket" in system
    assert guidance_schema(system.split("\n\n", 1)[1]) == TICKET_SCHEMA
    assert "'Ticket'" in change and "strict" in change and "json_object" in change


def test_every_other_field_is_left_as_it_was():
    original = structured_request()
    body = copy.deepcopy(original)
    downgrade_json_schema(body, DEFAULT_PATTERNS)
    for key in ("model", "temperature", "max_tokens"):
        assert body[key] == original[key]
    assert body["messages"][1:] == original["messages"][1:]
    assert set(body) == set(original)


def test_a_request_without_a_system_message_gets_one_at_the_front():
    body = structured_request(system=None)
    downgrade_json_schema(body, DEFAULT_PATTERNS)
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert guidance_schema(body["messages"][0]["content"]) == TICKET_SCHEMA


def test_a_system_message_made_of_parts_gets_one_more_part():
    body = structured_request(system=[{"type": "text", "text": "You file tickets."}])
    downgrade_json_schema(body, DEFAULT_PATTERNS)
    parts = body["messages"][0]["content"]
    assert parts[0] == {"type": "text", "text": "You file tickets."}
    assert guidance_schema(parts[1]["text"]) == TICKET_SCHEMA


@pytest.mark.parametrize(
    "model",
    [CODER_MODEL, "qwen3-coder-30b-a3b-instruct", "Qwen/Qwen3-Coder-30B-A3B-Instruct-FP8"],
)
def test_sparse_moe_coder_models_match_the_default_pattern_in_any_case(model):
    assert model_matches(model, DEFAULT_PATTERNS)


@pytest.mark.parametrize("model", [DENSE_MODEL, "gpt-4o", "Qwen3-30B-A3B", None, 42])
def test_other_models_do_not_match_the_default_pattern(model):
    assert not model_matches(model, DEFAULT_PATTERNS)


def test_a_non_matching_model_is_not_touched():
    body = structured_request(model=DENSE_MODEL)
    original = copy.deepcopy(body)
    assert downgrade_json_schema(body, DEFAULT_PATTERNS) is None
    assert body == original


@pytest.mark.parametrize("response_format", [{"type": "json_object"}, {"type": "text"}, None])
def test_other_response_formats_are_not_touched(response_format):
    body = {**structured_request(), "response_format": response_format}
    original = copy.deepcopy(body)
    assert downgrade_json_schema(body, DEFAULT_PATTERNS) is None
    assert body == original


def test_the_model_patterns_are_configurable():
    patterns = parse_model_patterns(" *gpt-oss* , *Qwen2.5-Coder* ")
    assert patterns == ("*gpt-oss*", "*Qwen2.5-Coder*")
    assert model_matches(DENSE_MODEL, patterns) and not model_matches(CODER_MODEL, patterns)


# --- the hook ---------------------------------------------------------------------


def chat_flow(body: dict | bytes, path: bytes = b"/v1/chat/completions") -> tflow.HTTPFlow:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = tutils.treq(method=b"POST", path=path, content=content)
    request.headers["content-type"] = "application/json"
    return tflow.tflow(req=request)


def test_the_hook_rewrites_a_matching_request_and_marks_the_flow():
    addon = JsonModeGuard()
    with taddons.context(addon):
        flow = chat_flow(structured_request())
        addon.request(flow)
        sent = json.loads(flow.request.content)
        assert sent["response_format"] == {"type": "json_object"}
        assert int(flow.request.headers["content-length"]) == len(flow.request.content)
        assert flow.marked == json_mode_guard.MARKER
        assert "json_schema 'Ticket' sent as json_object" in flow.comment
        assert flow.metadata[json_mode_guard.METADATA_KEY] == flow.comment


def test_the_hook_leaves_a_non_matching_request_byte_for_byte():
    addon = JsonModeGuard()
    raw = json.dumps(structured_request(model=DENSE_MODEL), indent=1).encode()
    with taddons.context(addon):
        flow = chat_flow(raw)
        addon.request(flow)
        assert flow.request.content == raw and not flow.marked and not flow.comment


def test_the_hook_leaves_the_anthropic_path_alone():
    addon = JsonModeGuard()
    raw = json.dumps(structured_request()).encode()
    with taddons.context(addon):
        flow = chat_flow(raw, path=b"/v1/messages")
        addon.request(flow)
        assert flow.request.content == raw


def test_the_hook_leaves_a_body_that_is_not_json_alone():
    addon = JsonModeGuard()
    with taddons.context(addon):
        flow = chat_flow(b'{"model": "Qwen3-Coder-30B-A3B", "response_format": ')
        addon.request(flow)
        assert flow.request.content == b'{"model": "Qwen3-Coder-30B-A3B", "response_format": '


def test_the_guard_can_be_switched_off():
    addon = JsonModeGuard()
    raw = json.dumps(structured_request()).encode()
    with taddons.context(addon) as tctx:
        tctx.configure(addon, json_mode_guard=False)
        flow = chat_flow(raw)
        addon.request(flow)
        assert flow.request.content == raw


def test_the_configured_patterns_decide_which_models_are_rewritten():
    addon = JsonModeGuard()
    with taddons.context(addon) as tctx:
        tctx.configure(addon, json_mode_guard_models="*Qwen2.5-Coder*")
        coder, dense = chat_flow(structured_request()), chat_flow(structured_request(model=DENSE_MODEL))
        addon.request(coder)
        addon.request(dense)
        assert json.loads(coder.request.content)["response_format"]["type"] == "json_schema"
        assert json.loads(dense.request.content)["response_format"] == {"type": "json_object"}


def test_an_empty_pattern_list_is_rejected_naming_the_option():
    addon = JsonModeGuard()
    with taddons.context(addon) as tctx:
        with pytest.raises(exceptions.OptionsError, match=r"json_mode_guard_models: ' , ' names no model pattern"):
            tctx.configure(addon, json_mode_guard_models=" , ")


def test_the_script_file_loads_as_mitmdump_would_load_it():
    with taddons.context() as tctx:
        module = tctx.script(str(Path(json_mode_guard.__file__)))
        assert type(module.addons[0]).__name__ == "JsonModeGuard"
        assert tctx.options.json_mode_guard_models == "*Coder*A3B*"


# --- end to end through a real mitmdump ----------------------------------------------


@pytest.fixture(scope="module")
def guarded_proxy(tmp_path_factory):
    with sse_upstream() as upstream:
        port = free_port()
        command = mitmdump_command(["addons/strip_billing.py", "addons/json_mode_guard.py"], upstream.url, port)
        with running("mitmdump", command, port=port, log_dir=tmp_path_factory.mktemp("mitmdump"), startup_timeout=60) as proxy:
            yield proxy, upstream


@pytest.mark.server
def test_end_to_end_the_server_receives_json_object_and_the_client_its_reply(guarded_proxy):
    proxy, upstream = guarded_proxy
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="test-key", max_retries=0, timeout=30)
    request = structured_request()
    completion = client.chat.completions.create(
        model=request["model"],
        messages=request["messages"],
        response_format=request["response_format"],
        extra_headers={"x-test-fixture": "openai_json_reply.json"},
    )
    assert json.loads(completion.choices[0].message.content) == {"title": "Fix cache", "priority": 2}
    arrived = upstream.requests[-1].json()
    assert arrived["response_format"] == {"type": "json_object"}
    assert guidance_schema(arrived["messages"][0]["content"].split("\n\n", 1)[1]) == TICKET_SCHEMA
    assert "sent as json_object" in proxy.log_text()


@pytest.mark.server
def test_end_to_end_a_non_matching_request_arrives_byte_for_byte(guarded_proxy):
    proxy, upstream = guarded_proxy
    raw = json.dumps(structured_request(model=DENSE_MODEL), indent=2).encode()
    request = urllib.request.Request(
        proxy.url + "/v1/chat/completions",
        data=raw,
        headers={"content-type": "application/json", "x-test-fixture": "openai_json_reply.json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
    assert upstream.requests[-1].body == raw
