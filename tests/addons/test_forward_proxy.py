"""As a forward proxy (`anthropic_engine`): Anthropic's hosts are answered by the engine, with
message threads kept off; without the option they pass through untouched."""

import json

import pytest
from mitmproxy import exceptions, http
from mitmproxy.test import taddons, tflow, tutils

from stable_prefix.addons import forward_proxy
from stable_prefix.addons.flow_notes import FLOW_NOTES
from tests.fixtures import claude_code
from tests.support.proxy_addons import ProxyAddons

ENGINE = "http://127.0.0.1:8000"
BETAS = "claude-code-20250219,message-threads-2026-08-12,effort-2025-11-24"


def anthropic_flow(body, *, host="api.anthropic.com", beta=BETAS, path="/v1/messages?beta=true"):
    content = json.dumps(body).encode()
    headers = http.Headers([(b"content-type", b"application/json"), (b"anthropic-beta", beta.encode()),
                            (b"host", host.encode()), (b"content-length", str(len(content)).encode())])
    request = tutils.treq(scheme=b"https", host=host, port=443, method=b"POST", path=path.encode(), headers=headers, content=content)
    return tflow.tflow(req=request)


@pytest.fixture
def addon():
    addon = ProxyAddons()
    with taddons.context(addon) as tctx:
        tctx.configure(addon, anthropic_engine=ENGINE, prefix_diagnosis=False)
        yield addon


def first_party_request():
    body = claude_code.modern_request()
    body["system"][0]["text"] = claude_code.BILLING_FORMS["first-party"]
    return body


def test_a_request_for_anthropics_api_goes_to_the_engine_and_through_the_rules(addon):
    flow = anthropic_flow(first_party_request())
    addon.request(flow)
    assert (flow.request.scheme, flow.request.host, flow.request.port) == ("http", "127.0.0.1", 8000)
    assert "x-anthropic-billing-header" not in flow.request.get_text()


def test_the_message_threads_beta_is_taken_out_and_the_other_betas_stay(addon):
    flow = anthropic_flow(claude_code.modern_request())
    addon.request(flow)
    assert flow.request.headers["anthropic-beta"] == "claude-code-20250219,effort-2025-11-24"


def test_a_thread_create_is_forwarded_whole_without_its_thread(addon):
    body = {**claude_code.modern_request(), "thread": {"type": "create"}}
    flow = anthropic_flow(body)
    addon.request(flow)
    forwarded = json.loads(flow.request.content)
    assert "thread" not in forwarded and len(forwarded["tools"]) == len(body["tools"]) and flow.response is None


def test_a_thread_continue_is_answered_with_a_400_that_says_what_to_set_and_never_forwarded(addon):
    body = {"model": "claude-opus-4-8", "max_tokens": 100, "messages": [],
            "thread": {"type": "continue", "previous_message_id": "msg_0001"}}
    flow = anthropic_flow(body)
    addon.request(flow)
    assert flow.response.status_code == 400
    error = json.loads(flow.response.content)["error"]
    assert error["type"] == "invalid_request_error" and "ANTHROPIC_BASE_URL" in error["message"]
    assert "message-thread continue" in flow.metadata[FLOW_NOTES]["answered_by_proxy"]


def test_a_request_for_another_host_is_left_where_it_goes(addon):
    flow = anthropic_flow(claude_code.modern_request(), host="example.org")
    addon.request(flow)
    assert flow.request.host == "example.org" and flow.request.headers["anthropic-beta"] == BETAS


def test_without_the_option_anthropics_hosts_pass_through_untouched():
    addon = ProxyAddons()
    with taddons.context(addon):
        flow = anthropic_flow(first_party_request())
        before = flow.request.content
        addon.request(flow)
        assert flow.request.host == "api.anthropic.com" and flow.request.content == before


@pytest.mark.parametrize("value", ["127.0.0.1:8000", "ftp://127.0.0.1", "http://127.0.0.1:8000/v1"])
def test_an_engine_that_is_not_a_plain_http_address_is_refused_naming_the_option(value):
    addon = ProxyAddons()
    with taddons.context(addon) as tctx, pytest.raises(exceptions.OptionsError, match=f"anthropic_engine={value!r}"):
        tctx.configure(addon, anthropic_engine=value)


def test_a_beta_list_of_only_threads_leaves_no_empty_header(addon):
    flow = anthropic_flow(claude_code.modern_request(), beta="message-threads-2026-08-12")
    addon.request(flow)
    assert "anthropic-beta" not in flow.request.headers


def test_without_threads_beta_keeps_every_other_token_in_order():
    assert forward_proxy.without_threads_beta("a-1, message-threads-x ,b-2") == "a-1,b-2"
