"""strict_router_body: a body smg's strict schema accepts, changed only where vllm-mlx reads nothing."""

import copy
import json

from mitmproxy import http
from mitmproxy.test import taddons, tflow, tutils

from stable_prefix.addons import normalize, router_compat
from tests.fixtures import claude_code, codex
from tests.support.proxy_addons import ProxyAddons

STRICT = normalize.Rules(strict_router_body=True, max_tokens_cap=8192)


def claude_code_332(**top) -> dict:
    """2.1.332's main request: its environment message carries its own output_config."""
    body = claude_code.modern_request(2)
    body["messages"][1]["output_config"] = {"effort": "medium"}
    body.update(top)
    return body


def test_a_messages_fields_besides_role_and_content_are_dropped_and_named():
    body = claude_code_332()
    changes = normalize.normalize(body, "anthropic", STRICT)
    assert all(set(message) <= {"role", "content"} for message in body["messages"])
    assert any(change.rule == router_compat.STRICT_ROUTER and "output_config" in change.detail for change in changes)


def test_what_the_engine_reads_is_left_as_it_was():
    strict, plain = claude_code_332(temperature=0, tool_choice={"type": "auto"}), claude_code_332(temperature=0, tool_choice={"type": "auto"})
    normalize.normalize(strict, "anthropic", STRICT)
    normalize.normalize(plain, "anthropic", normalize.Rules(max_tokens_cap=8192))
    for field in ("model", "system", "tools", "tool_choice", "max_tokens", "temperature", "stream", "metadata"):
        assert strict[field] == plain[field]
    assert [(m["role"], m["content"]) for m in strict["messages"]] == [(m["role"], m["content"]) for m in plain["messages"]]


def test_the_messages_model_fields_are_the_ones_vllm_mlx_reads():
    """Fails the day vllm-mlx reads another field of a message: then the rule must keep it."""
    from vllm_mlx.api.anthropic_models import AnthropicMessage

    assert tuple(AnthropicMessage.model_fields) == router_compat.STRICT_ROUTER_MESSAGE_FIELDS


def test_vllm_mlx_reads_no_thinking_field():
    from vllm_mlx.api.anthropic_models import AnthropicRequest

    assert "thinking" not in AnthropicRequest.model_fields


def test_thinking_whose_budget_the_cap_left_above_max_tokens_is_dropped():
    body = claude_code_332(thinking={"type": "enabled", "budget_tokens": 16000}, max_tokens=64000)
    normalize.normalize(body, "anthropic", STRICT)
    assert "thinking" not in body and body["max_tokens"] == 8192


def test_thinking_within_max_tokens_stays():
    body = claude_code_332(thinking={"type": "enabled", "budget_tokens": 1024})
    normalize.normalize(body, "anthropic", STRICT)
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 1024}


def test_a_responses_request_without_temperature_gets_the_engines_own_default():
    """smg sets 1.0 where the client sent none; vllm-mlx would have sampled at its fallback."""
    from vllm_mlx import server

    body = {"model": "tiny", "input": "hi", "max_output_tokens": 16}
    normalize.normalize(body, "responses", STRICT)
    assert body["temperature"] == router_compat.ENGINE_DEFAULT_TEMPERATURE == server._FALLBACK_TEMPERATURE


def test_a_responses_temperature_the_client_chose_stays():
    body = {"model": "tiny", "input": "hi", "temperature": 0.2}
    normalize.normalize(body, "responses", STRICT)
    assert body["temperature"] == 0.2


def test_off_by_default_the_body_keeps_every_field():
    body = claude_code_332()
    normalize.normalize(body, "anthropic", normalize.Rules())
    assert body["messages"][0]["output_config"] == {"effort": "medium"}  # the environment message, moved to the front


def test_the_addon_logs_each_drop(caplog):
    addon = ProxyAddons()
    flow = tflow.tflow(req=tutils.treq(host="127.0.0.1", port=8000, method=b"POST", path=b"/v1/messages",
                                       headers=http.Headers(((b"content-type", b"application/json"),)),
                                       content=json.dumps(copy.deepcopy(claude_code_332())).encode()))
    with taddons.context(addon) as tctx, caplog.at_level("INFO"):
        tctx.configure(addon, strict_router_body=True)
        addon.request(flow)
    assert "strict_router_body: strict_router messages[0]: dropped output_config" in caplog.text
    assert "output_config" not in json.dumps(json.loads(flow.request.content)["messages"])


def test_a_responses_field_smg_refuses_and_the_engine_ignores_is_dropped():
    """Codex 0.171 sends client_metadata: smg answers 400 unknown field."""
    body = codex.Conversation("Fix the test.").request()
    changes = normalize.normalize(body, "responses", STRICT)
    assert "client_metadata" not in body and any("client_metadata" in change.detail for change in changes)
    assert body["prompt_cache_key"] and body["include"]  # smg accepts these: they stay


def test_a_responses_field_the_engine_reads_stays_even_where_smg_refuses_it():
    body = {"model": "tiny", "input": "hi", "chat_template_kwargs": {"enable_thinking": False}}
    normalize.normalize(body, "responses", STRICT)
    assert body["chat_template_kwargs"] == {"enable_thinking": False}


def test_the_responses_fields_kept_for_the_engine_are_the_ones_vllm_mlx_reads():
    from vllm_mlx.api.responses_models import ResponsesRequest

    assert set(router_compat.ENGINE_RESPONSES_FIELDS) == set(ResponsesRequest.model_fields)
