"""The lane routing header: a stable key per lane on forwarded requests, for multi-replica routers."""

import json

import pytest
from mitmproxy import exceptions, http
from mitmproxy.test import taddons, tflow, tutils

from stable_prefix.addons import normalize, request_shape
from stable_prefix.addons.lanes import routing_key
from tests.fixtures import claude_code
from tests.support.llm_client import send
from tests.support.processes import LOOPBACK, free_port, mitmdump_command, running, serving
from tests.support.proxy_addons import ProxyAddons
from tests.support.recording_anthropic_stub import RecordingHandler

HEADER = "x-session-id"


def forwarded_key(body: dict, api: request_shape.Api = "anthropic") -> str:
    """The key of a body as the proxy forwards it: after the default rules."""
    normalize.normalize(body, api, normalize.Rules())
    return routing_key(body, api)


def test_every_turn_of_a_conversation_gets_the_same_key():
    keys = {forwarded_key(claude_code.main_request(turns)) for turns in (1, 3, 12)}
    assert len(keys) == 1


def test_a_rotating_billing_header_does_not_change_the_key():
    assert forwarded_key(claude_code.main_request(billing_suffix="a3f")) == forwarded_key(claude_code.main_request(billing_suffix="9c0", cch="77"))


def test_each_lane_gets_its_own_key():
    keys = [forwarded_key(claude_code.main_request()), forwarded_key(claude_code.subagent_request("explore")),
            forwarded_key(claude_code.subagent_request("general")), forwarded_key(claude_code.title_request())]
    assert len(set(keys)) == len(keys)


def test_two_projects_of_the_same_agent_get_different_keys():
    """The environment (working directory) is part of the head: users and projects spread over replicas."""
    assert forwarded_key(claude_code.modern_request(workdir="/home/dev/app")) != forwarded_key(claude_code.modern_request(workdir="/home/dev/site"))


@pytest.mark.parametrize("request_of", [claude_code.main_request, claude_code.modern_request], ids=["2.1.197", "2.1.332"])
def test_two_conversations_in_one_project_share_a_key_whatever_their_git_status(request_of):
    """The rules move the git status out of the head, so a new conversation goes where its head is cached."""
    assert forwarded_key(request_of(git_status="M src/app.py")) == forwarded_key(request_of(git_status="?? notes.md"))


def test_the_moving_cache_marker_does_not_change_the_key():
    body = claude_code.main_request()
    moved = json.loads(json.dumps(body))
    moved["tools"][-1]["cache_control"] = {"type": "ephemeral"}
    assert forwarded_key(body) == forwarded_key(moved)


def test_the_openai_form_has_a_key_too():
    first, later = claude_code.openai_request(turns=2), claude_code.openai_request(turns=4)
    assert forwarded_key(first, "openai") == forwarded_key(later, "openai")
    assert len(forwarded_key(first, "openai")) == 32


def request_flow(body: dict):
    return tflow.tflow(req=tutils.treq(host="127.0.0.1", port=8000, method=b"POST", path=b"/v1/messages",
                                       headers=http.Headers(((b"content-type", b"application/json"),)),
                                       content=json.dumps(body).encode()))


def test_the_addon_adds_the_header_when_the_option_names_one():
    addon = ProxyAddons()
    with taddons.context(addon) as tctx:
        tctx.configure(addon, lane_routing_header=HEADER)
        flow = request_flow(claude_code.main_request())
        addon.request(flow)
    assert flow.request.headers[HEADER] == forwarded_key(claude_code.main_request())


def test_no_header_is_added_by_default():
    addon = ProxyAddons()
    with taddons.context(addon):
        flow = request_flow(claude_code.main_request())
        addon.request(flow)
    assert HEADER not in flow.request.headers


def test_a_header_name_that_is_not_one_is_refused():
    addon = ProxyAddons()
    with taddons.context(addon) as tctx, pytest.raises(exceptions.OptionsError, match="lane_routing_header='x session'"):
        tctx.configure(addon, lane_routing_header="x session")


@pytest.mark.server
def test_the_header_reaches_the_upstream_through_a_real_proxy(tmp_path):
    record = tmp_path / "upstream.jsonl"
    handler = type("Recorder", (RecordingHandler,), {"record_path": record})
    upstream_port, proxy_port = free_port(), free_port()
    command = mitmdump_command(["addons/strip_billing.py"], f"http://{LOOPBACK}:{upstream_port}", proxy_port,
                               {"lane_routing_header": HEADER})
    with serving(handler, upstream_port, "recording upstream"), running("proxy", command, port=proxy_port, log_dir=tmp_path) as proxy:
        for turns in (2, 3):
            send(proxy.url, "/v1/messages", claude_code.main_request(turns))
        send(proxy.url, "/v1/messages", claude_code.subagent_request("explore"))
    arrived = [json.loads(line) for line in record.read_text().splitlines()]
    keys = [entry["headers"].get(HEADER) for entry in arrived if entry["path"].startswith("/v1/messages")]
    assert keys[0] == keys[1] == forwarded_key(claude_code.main_request()) and keys[2] != keys[0]


def test_the_lane_scope_gives_each_subagent_instance_a_key_of_its_own():
    body = claude_code.modern_subagent_request("explore")
    normalize.normalize(body, "anthropic", normalize.Rules())
    first, second = (routing_key(body, "anthropic", claude_code.agent_headers(agent_id), scope="lane") for agent_id in ("a1b2c3d4e5", "f6e7d8c9b0"))
    assert first != second


def test_the_head_scope_keeps_a_fan_outs_instances_together():
    body = claude_code.modern_subagent_request("explore")
    normalize.normalize(body, "anthropic", normalize.Rules())
    keys = {routing_key(body, "anthropic", claude_code.agent_headers(agent_id)) for agent_id in ("a1b2c3d4e5", "f6e7d8c9b0")}
    assert len(keys) == 1


def test_the_lane_scope_leaves_the_main_agents_key_its_heads():
    body = claude_code.modern_request()
    normalize.normalize(body, "anthropic", normalize.Rules())
    assert routing_key(body, "anthropic", claude_code.agent_headers(), scope="lane") == routing_key(body, "anthropic")


def test_the_key_goes_out_under_every_header_the_option_names():
    addon = ProxyAddons()
    with taddons.context(addon) as tctx:
        tctx.configure(addon, lane_routing_header="x-smg-routing-key, x-session-id")
        flow = request_flow(claude_code.main_request())
        addon.request(flow)
    assert flow.request.headers["x-smg-routing-key"] == flow.request.headers["x-session-id"] == forwarded_key(claude_code.main_request())


def test_an_unknown_key_scope_is_refused():
    addon = ProxyAddons()
    with taddons.context(addon) as tctx, pytest.raises(exceptions.OptionsError, match="routing_key_scope='user'"):
        tctx.configure(addon, routing_key_scope="user")


def test_the_first_turn_and_the_next_share_a_key_though_the_first_marks_its_environment_for_caching():
    """2.1.332's first request: the environment message is the newest and carries the cache marker."""
    assert forwarded_key(claude_code.modern_request(1)) == forwarded_key(claude_code.modern_request(2)) == forwarded_key(claude_code.modern_request(5))


def test_the_diagnosis_reads_the_clients_own_value_of_a_header_the_key_replaced():
    """opencode names its sessions in x-session-id, the header vllm-router reads the key from."""
    from stable_prefix.addons.flow_notes import client_headers

    addon = ProxyAddons()
    with taddons.context(addon) as tctx:
        tctx.configure(addon, lane_routing_header="x-session-id,x-smg-routing-key")
        flow = request_flow(claude_code.main_request())
        flow.request.headers["x-session-id"] = "ses_client_own"
        addon.request(flow)
    assert flow.request.headers["x-session-id"] == forwarded_key(claude_code.main_request())
    assert client_headers(flow)["x-session-id"] == "ses_client_own" and "x-smg-routing-key" not in client_headers(flow)
