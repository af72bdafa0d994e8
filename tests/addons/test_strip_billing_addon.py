"""The strip_billing addon, driven through mitmproxy's own test harness."""

import gzip
import json
import logging
from pathlib import Path

import pytest
from mitmproxy import exceptions, http
from mitmproxy.test import taddons, tflow, tutils

from stable_prefix.addons import normalizer
from stable_prefix.addons.flow_notes import FLOW_NOTES
from tests.fixtures import claude_code
from tests.support.proxy_addons import ProxyAddons

SCRIPT = Path(__file__).resolve().parents[2] / "addons" / "strip_billing.py"


def api_flow(body, *, path="/v1/messages?beta=true", host="127.0.0.1", method="POST", headers=None):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    header_pairs = headers if headers is not None else [(b"content-type", b"application/json")]
    header_pairs = header_pairs + [(b"content-length", str(len(content)).encode())]
    request = tutils.treq(host=host, port=8000, method=method.encode(), path=path.encode(), headers=http.Headers(header_pairs), content=content)
    return tflow.tflow(req=request)


def sent_body(flow):
    return json.loads(flow.request.content)


def forward(addon, flow):
    """The request leaves, then the upstream answers with event-stream headers."""
    addon.request(flow)
    flow.response = tutils.tresp(headers=http.Headers(((b"content-type", b"text/event-stream"),)))
    addon.responseheaders(flow)
    return flow


@pytest.fixture
def addon():
    addon = ProxyAddons()
    with taddons.context(addon) as tctx:
        addon.tctx = tctx
        yield addon


# --- what it changes ----------------------------------------------------------


def test_billing_block_is_stripped_and_content_length_matches(addon):
    flow = api_flow(claude_code.main_request(cch="9f2c1"))
    addon.request(flow)
    body = sent_body(flow)
    assert not any("x-anthropic-billing-header" in block["text"] for block in body["system"])
    assert flow.request.headers["content-length"] == str(len(flow.request.raw_content))


def test_system_message_in_messages_reaches_the_upstream_as_a_user_reminder(addon):
    flow = api_flow(claude_code.main_request(turns=2))
    addon.request(flow)
    # initial context: moved before the first user message
    assert sent_body(flow)["messages"][0] == {"role": "user", "content": "<system-reminder>\nThe user opened src/app.py in the editor.\n</system-reminder>"}


def test_todays_claude_code_request_reaches_the_upstream_with_stable_context_first(addon):
    flow = api_flow(claude_code.modern_request(turns=3, load_tools_at={2: ("WebFetch",)}))
    addon.request(flow)
    body = sent_body(flow)
    assert [message["role"] for message in body["messages"]][:2] == ["user", "user"]
    assert body["messages"][0]["content"].startswith("<system-reminder>\n# Environment")
    assert "WebFetch" not in [tool["name"] for tool in body["tools"]] and body["tools"][-1]["name"] == "DeferredPlaceholder"


def test_openai_chat_path_is_normalized_too(addon):
    flow = api_flow(claude_code.openai_request(), path="/v1/chat/completions")
    addon.request(flow)
    messages = sent_body(flow)["messages"]
    assert not messages[0]["content"].startswith("x-anthropic-billing-header")
    assert messages[2]["role"] == "user"


def test_upstream_model_and_max_tokens_cap_are_applied(addon):
    addon.tctx.configure(addon, upstream_model="qwen3-coder", max_tokens_cap=8192)
    flow = api_flow(claude_code.main_request())
    addon.request(flow)
    body = sent_body(flow)
    assert (body["model"], body["max_tokens"]) == ("qwen3-coder", 8192)


def test_model_map_patterns_win_over_upstream_model(addon):
    addon.tctx.configure(addon, upstream_model="big-coder", model_map="claude-*haiku*=small-coder")
    haiku, opus = api_flow(claude_code.subagent_request()), api_flow(claude_code.main_request())
    addon.request(haiku)
    addon.request(opus)
    assert (sent_body(haiku)["model"], sent_body(opus)["model"]) == ("small-coder", "big-coder")


def test_rules_can_be_switched_off(addon):
    addon.tctx.configure(addon, strip_billing_header=False, rewrite_system_messages=False, relocate_git_status=False,
                         lead_with_stable_context=False, inline_loaded_tools=False)
    raw = json.dumps(claude_code.modern_request(3, load_tools_at={2: ("WebFetch",)})).encode()
    flow = api_flow(raw)
    addon.request(flow)
    assert flow.request.raw_content == raw


def test_optional_rules_can_be_switched_on(addon):
    addon.tctx.configure(addon, drop_date_line=True, sort_tools=True)
    flow = api_flow(claude_code.main_request())
    addon.request(flow)
    body = sent_body(flow)
    assert "Today's date is" not in json.dumps(body["system"])
    assert [tool["name"] for tool in body["tools"]] == sorted(tool["name"] for tool in body["tools"])


def test_gzip_body_is_decoded_normalized_and_sent_gzipped(addon):
    content = gzip.compress(json.dumps(claude_code.main_request()).encode())
    flow = api_flow(content, headers=[(b"content-type", b"application/json"), (b"content-encoding", b"gzip")])
    addon.request(flow)
    assert flow.request.headers["content-encoding"] == "gzip"
    assert flow.request.headers["content-length"] == str(len(flow.request.raw_content))
    assert "x-anthropic-billing-header" not in gzip.decompress(flow.request.raw_content).decode()


def test_ten_megabyte_body_is_normalized(addon):
    body = claude_code.main_request()
    body["messages"][0]["content"] = "x" * (10 * 1024 * 1024)
    flow = api_flow(body)
    addon.request(flow)
    sent = sent_body(flow)
    assert len(sent["messages"][1]["content"][-1]["text"]) == 10 * 1024 * 1024  # after the initial context and the git status
    assert "x-anthropic-billing-header" not in sent["system"][0]["text"]
    assert flow.request.headers["content-length"] == str(len(flow.request.raw_content))


def test_a_body_with_nothing_to_change_goes_byte_for_byte(addon):
    body = claude_code.modern_request(1)
    body["tools"] = claude_code.MODERN_TOOLS  # no deferred tools
    body["system"] = body["system"][1:]
    body["messages"] = body["messages"][:1]
    raw = json.dumps(body, indent=3).encode()  # spacing a re-serialization would lose
    flow = api_flow(raw)
    addon.request(flow)
    assert flow.request.raw_content == raw


# --- what it leaves alone -----------------------------------------------------

def _ten_megabytes_with_nothing_to_change() -> bytes:
    body = claude_code.modern_request(turns=1)
    body["tools"] = claude_code.MODERN_TOOLS  # no deferred tools
    body["system"] = body["system"][1:]  # no billing block
    body["messages"] = body["messages"][:1]  # no system message
    body["messages"][0]["content"][0]["text"] = "y" * (10 * 1024 * 1024)
    return json.dumps(body, indent=1).encode()


UNTOUCHED = {
    "10 MB, nothing to change": dict(body=_ten_megabytes_with_nothing_to_change()),
    "not JSON": dict(body=b"hello, not json"),
    "truncated JSON": dict(body=json.dumps(claude_code.main_request()).encode()[:-40]),
    "JSON array": dict(body=b'[{"system": "x-anthropic-billing-header: a"}]'),
    "text content type": dict(body=json.dumps(claude_code.main_request()).encode(), headers=[(b"content-type", b"text/plain")]),
    "undecodable gzip": dict(body=b"not gzip at all", headers=[(b"content-type", b"application/json"), (b"content-encoding", b"gzip")]),
    "unknown encoding": dict(body=json.dumps(claude_code.main_request()).encode(), headers=[(b"content-encoding", b"x-custom")]),
    "other path": dict(body=json.dumps(claude_code.main_request()).encode(), path="/v1/messages/count_tokens"),
    "GET": dict(body=json.dumps(claude_code.main_request()).encode(), method="GET"),
    "Anthropic's API": dict(body=json.dumps(claude_code.main_request()).encode(), host="api.anthropic.com"),
    "Anthropic subdomain": dict(body=json.dumps(claude_code.main_request()).encode(), host="eu.api.anthropic.com"),
}


@pytest.mark.parametrize("case", UNTOUCHED, ids=list(UNTOUCHED))
def test_requests_it_must_not_touch_pass_byte_for_byte(addon, case):
    spec = dict(UNTOUCHED[case])
    raw = spec.pop("body")
    flow = api_flow(raw, **spec)
    headers_before = flow.request.headers.copy()
    addon.request(flow)
    assert flow.request.raw_content == raw
    assert flow.request.headers == headers_before
    if case != "10 MB, nothing to change":  # ours, readable, just nothing to do
        assert FLOW_NOTES not in flow.metadata


def test_unreadable_body_is_logged_with_what_happened(addon, caplog):
    caplog.set_level(logging.WARNING)
    addon.request(api_flow(b'{"model": "claude", "messa'))
    assert "/v1/messages?beta=true: body is not valid JSON" in caplog.text
    assert "passed through unchanged" in caplog.text


def test_anthropic_host_in_reverse_mode_host_header_is_left_alone(addon):
    raw = json.dumps(claude_code.main_request()).encode()
    flow = api_flow(raw, headers=[(b"host", b"api.anthropic.com"), (b"content-type", b"application/json")])
    addon.request(flow)
    assert flow.request.raw_content == raw


# --- options ------------------------------------------------------------------


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("model_map", "claude-*", "model_map='claude-\\*'"),
        ("model_map", "a=b,=c", "model_map='a=b,=c'"),
        ("max_tokens_cap", -1, "max_tokens_cap=-1"),
    ],
)
def test_bad_option_values_are_rejected_naming_option_and_value(addon, option, value, message):
    with pytest.raises(exceptions.OptionsError, match=message):
        addon.tctx.configure(addon, **{option: value})


# --- streaming, diagnosis, notes ---------------------------------------------


def test_event_stream_responses_are_streamed():
    addon = ProxyAddons()
    sse = tflow.tflow(resp=tutils.tresp(headers=http.Headers(((b"content-type", b"text/event-stream; charset=utf-8"),))))
    plain = tflow.tflow(resp=tutils.tresp(headers=http.Headers(((b"content-type", b"application/json"),))))
    addon.responseheaders(sse)
    addon.responseheaders(plain)
    assert sse.response.stream is True and not plain.response.stream


def test_existing_stream_callable_is_kept():
    def transform(chunk):
        return chunk

    flow = tflow.tflow(resp=tutils.tresp(headers=http.Headers(((b"content-type", b"text/event-stream"),))))
    flow.response.stream = transform
    ProxyAddons().responseheaders(flow)
    assert flow.response.stream is transform


def test_diagnosis_goes_to_the_comment_and_the_log(addon, caplog):
    caplog.set_level(logging.INFO)
    first, second = api_flow(claude_code.main_request(turns=2, cch="aaaaa")), api_flow(claude_code.main_request(turns=3, cch="bbbbb"))
    forward(addon, first)
    forward(addon, second)
    assert first.comment.startswith("lane main · first request")
    assert second.comment.startswith("lane main · prefix stable ")
    assert "(billing header; stripped)" in second.comment
    assert second.comment.splitlines()[1].startswith("normalized: billing_header system[0]: removed billing header block")
    assert not second.marked
    assert "lane main · prefix stable" in caplog.text


def test_a_broken_prefix_marks_the_flow(addon):
    forward(addon, api_flow(claude_code.main_request(turns=2)))
    cleared = api_flow(claude_code.main_request(turns=1, git_status="M other.py"))
    forward(addon, cleared)
    assert cleared.marked and "prefix broke at messages[1].content[0].text" in cleared.comment and "(new conversation)" in cleared.comment


def test_subagent_and_title_requests_get_their_own_lanes(addon):
    flows = [api_flow(body) for body in (claude_code.main_request(2), claude_code.subagent_request(), claude_code.title_request(), claude_code.main_request(3))]
    for flow in flows:
        forward(addon, flow)
    lanes = [flow.metadata["stable_prefix"]["lane"] for flow in flows]
    assert lanes[0] == lanes[3] == "main"
    assert lanes[1].startswith("sub:") and lanes[2] == "side:title"
    assert not flows[3].marked


def test_flow_notes_keep_the_client_body_and_the_changes(addon):
    raw = json.dumps(claude_code.main_request()).encode()
    flow = forward(addon, api_flow(raw))
    notes = flow.metadata["stable_prefix"]
    assert notes["client_body"] == raw and notes["api"] == "anthropic"
    assert notes["changes"][0].startswith("billing_header system[0]")
    assert notes["diagnosis"]["lane"] == "main"


def test_diagnosis_can_be_switched_off(addon):
    addon.tctx.configure(addon, prefix_diagnosis=False)
    flow = forward(addon, api_flow(claude_code.main_request()))
    assert flow.comment.startswith("normalized: billing_header system[0]")
    assert "lane" not in flow.comment and "lane" not in flow.metadata["stable_prefix"]


def test_session_totals_are_logged_at_shutdown(addon, caplog):
    caplog.set_level(logging.INFO)
    for turns in (1, 2, 3):
        forward(addon, api_flow(claude_code.main_request(turns=turns, cch=f"c{turns}")))
    addon.done()
    assert "lane main · 3 requests · prefix kept 2/2" in caplog.text


def test_the_diagnosis_waits_until_the_request_has_left(addon):
    flow = api_flow(claude_code.main_request())
    addon.request(flow)
    assert "lane" not in flow.comment and "lane" not in flow.metadata["stable_prefix"]
    addon.responseheaders(tflow.tflow(resp=True))  # another flow's answer changes nothing here
    flow.response = tutils.tresp()
    addon.responseheaders(flow)
    assert flow.comment.startswith("lane main · first request")


def test_a_request_the_upstream_never_answered_is_diagnosed_too(addon):
    flow = api_flow(claude_code.main_request())
    addon.request(flow)
    flow.error = tflow.terr()
    addon.error(flow)
    assert flow.metadata["stable_prefix"]["lane"] == "main"


def test_the_script_file_loads_as_mitmdump_loads_it():
    with taddons.context() as tctx:
        script = tctx.script(str(SCRIPT))
        names = [type(addon).__name__ for addon in script.addons]  # one concern each, in the order their hooks run
        assert names == ["ForwardProxy", "Normalizer", "RoutingKey", "DiagnosePrefix", "StreamEventStreams", "FollowResponseChains",
                         "LlamaSlots", "StreamRecovery", "EngineErrors", "ExposureWarning"]
        addon = script.addons[names.index("Normalizer")]
        assert script.__name__.startswith("__mitmproxy_script__")
        assert type(addon) is normalizer.Normalizer  # one set of rules, not a copy
        tctx.options.update(upstream_model="served")  # the options the script declared
        addon.configure({"upstream_model"})
        flow = api_flow(claude_code.main_request())
        addon.request(flow)
        assert sent_body(flow)["model"] == "served"
        assert "x-anthropic-billing-header" not in flow.request.get_text()
