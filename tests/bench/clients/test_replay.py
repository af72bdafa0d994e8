"""Where the replay reads each request's reuse from, in order of preference."""

import dataclasses
import json

from stable_prefix.bench.clients.replay import (
    AGENT_ID_HEADER,
    CHAT_COMPLETIONS_PATH,
    MESSAGES_PATH,
    PROXY_MAX_TOKENS_CAP,
    LogFollower,
    Replayer,
    Reply,
    _diagnosis_line,
    for_client,
    instances,
    post_streamed,
    reuse_figures,
    reuse_from_log,
    reuse_in_log,
    reuse_matching_prompt,
    steps,
)
from stable_prefix.bench.workload.session import Request
from stable_prefix.servers import free_port
from stable_prefix.usage import prompt_tokens_in_usage
from tests.support.sse_upstream import sse_upstream

HIT = "INFO:vllm_mlx.engine.simple:System KV cache HIT (stream_chat): reusing 6378 tokens, prefilling 523 new (hash=ab12)"
MISS = "INFO:vllm_mlx.engine.simple:System KV cache MISS (stream_chat): will prefill 6378 system + 15 suffix tokens (hash=ab12)"
# vllm-mlx --continuous-batching: the fetch says HIT for an exact match, the scheduler then prefills it all.
BATCHED_FETCH = "INFO:vllm_mlx.scheduler:[cache_fetch] request=566afc97-975 HIT prompt_tokens=3428 cached=3428 remaining=0 time=0.000s"
BATCHED_EXACT = "INFO:vllm_mlx.scheduler:[schedule] request=566afc97-975 uid=9 prompt_tokens=3428 tokens_to_prefill=3428 max_tokens=8 running=1 waiting=0"
BATCHED_HIT = "INFO:vllm_mlx.scheduler:[schedule] request=4b1d0c2e-7aa uid=3 prompt_tokens=6901 tokens_to_prefill=508, 6393 cached max_tokens=8 running=1 waiting=0"
# Rapid-MLX 0.16.10 on an exact repeat: its usage says all 46 cached, its scheduler prefills the last token again.
RAPID_EXACT = "INFO:rapid_mlx.scheduler:[schedule] request=eaa21f77-c18 uid=1 prompt_tokens=46 tokens_to_prefill=1, 46 cached max_tokens=64 running=1 waiting=0"
RAPID_ORDER = ("server-log", "usage")


def ok(usage=None):
    return Reply(status=200, ttft_s=0.1, total_s=0.2, usage=usage or {})


def test_usage_from_the_patched_engine_comes_first():
    usage = {"input_tokens": 300, "cache_read_input_tokens": 4000, "output_tokens": 8}
    assert reuse_figures(ok(usage), None, None, reuse_from_log([HIT])) == ((4300, 4000), "usage")


def test_cache_stats_deltas_when_usage_has_no_reuse():
    before, after = {"tokens_reused": 100, "tokens_prefilled": 50}, {"tokens_reused": 700, "tokens_prefilled": 80}
    assert reuse_figures(ok({"output_tokens": 8}), before, after, None) == ((630, 600), "stats")


def test_shipped_vllm_mlx_hit_and_miss_log_lines():
    assert reuse_figures(ok(), None, None, reuse_from_log(["noise", HIT])) == ((6901, 6378), "server-log")
    assert reuse_figures(ok(), None, None, reuse_from_log([MISS])) == ((6393, 0), "server-log")


def test_batched_vllm_mlx_reuse_is_what_its_scheduler_prefilled_not_what_its_fetch_matched():
    assert reuse_from_log([BATCHED_FETCH, BATCHED_EXACT]) == (3428, 0)
    assert reuse_from_log([BATCHED_HIT]) == (6901, 6393)


def test_a_request_no_source_covers_has_unknown_reuse_not_zero():
    assert reuse_figures(ok(), None, None, reuse_from_log(["INFO: System KV cache SKIP (stream_chat): ..."])) == (None, None)


def test_a_failed_request_has_no_reuse_figures():
    assert reuse_figures(Reply(status=500, ttft_s=None, total_s=0.1, error="HTTP 500"), None, None, (10, 5)) == (None, None)


def test_concurrent_requests_log_lines_are_matched_by_prompt_size():
    entries = reuse_in_log([BATCHED_HIT, HIT, BATCHED_EXACT])
    assert reuse_matching_prompt(entries, 6901) is None  # two entries of that size that disagree: unknown
    assert reuse_matching_prompt(entries, 3428) == (3428, 0)
    assert reuse_matching_prompt(entries, 1234) is None
    assert reuse_matching_prompt(entries, None) is None


def test_an_engine_that_prefers_its_log_gets_what_its_scheduler_prefilled():
    usage = {"input_tokens": 0, "cache_read_input_tokens": 46, "output_tokens": 14}
    assert reuse_figures(ok(usage), None, None, reuse_from_log([RAPID_EXACT]), RAPID_ORDER) == ((46, 45), "server-log")
    assert reuse_figures(ok(usage), None, None, None, RAPID_ORDER) == ((46, 46), "usage")  # no line: its usage, as it says
    assert reuse_figures(ok(usage), None, None, reuse_from_log([RAPID_EXACT])) == ((46, 46), "usage")  # the default order


def test_the_prompt_size_a_server_counted_is_read_from_its_usage():
    assert prompt_tokens_in_usage({"input_tokens": 34, "cache_read_input_tokens": 46}) == 80
    assert prompt_tokens_in_usage({"input_tokens": 80, "output_tokens": 3}) == 80  # Rapid-MLX leaves out a cache read of 0
    assert prompt_tokens_in_usage({"prompt_tokens": 12, "completion_tokens": 4}) == 12
    assert prompt_tokens_in_usage({"output_tokens": 3}) is None


def request(index, fan_out=None, agent=None, lane="sub:explore", beside=None):
    return Request(index, lane, 0, {}, headers={AGENT_ID_HEADER: agent} if agent else {}, fan_out=fan_out, beside=beside)


def test_a_fan_out_group_is_one_step_and_its_instances_keep_their_order():
    session = [request(0), request(1, "g", "a"), request(2, "g", "b"), request(3, "g", "a"), request(4, "g", "b"), request(5)]
    assert [[r.index for r in step] for step in steps(session)] == [[0], [1, 2, 3, 4], [5]]
    assert [[r.index for r in instance] for instance in instances(steps(session)[1])] == [[1, 3], [2, 4]]


def test_a_title_sent_beside_its_main_turn_is_one_step_with_it():
    session = [request(0, lane="main"), request(1, lane="title", beside=0), request(2, lane="main"), request(3, lane="title", beside=0)]
    assert [[r.index for r in step] for step in steps(session)] == [[0, 1], [2], [3]]  # only right beside the one it accompanies
    assert [[r.index for r in instance] for instance in instances(steps(session)[0])] == [[0], [1]]


def streamed(index, fixture, lane="main", beside=None, **headers):
    body = {"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": "hi"}], "temperature": 1, "max_tokens": 32_000, "stream": True}
    return Request(index, lane, 0, body, headers={"x-test-fixture": fixture, **headers}, beside=beside)


def test_a_request_sent_beside_another_goes_out_once_that_one_is_on_its_way_and_runs_with_it():
    main = streamed(0, "anthropic_text_then_call.sse", **{"x-test-pause-before": "content_block_delta", "x-test-pause-seconds": "0.6"})
    title = streamed(1, "anthropic_text_then_call.sse", lane="title", beside=0)
    with sse_upstream() as upstream:
        measured = {result.request.index: result for result in Replayer(upstream.url).step([main, title])}
    assert [json.loads(recorded.body)["messages"] for recorded in upstream.requests] == [main.body["messages"]] * 2
    first, second = measured[0], measured[1]
    assert first.started_s <= second.started_s < first.started_s + first.reply.total_s  # after it was sent, before it ended
    assert second.started_s + second.reply.total_s < first.started_s + first.reply.total_s  # the paused main turn ends last


def test_the_replay_asks_every_engine_for_a_greedy_reply_of_max_tokens_as_the_addon_caps_it():
    main = streamed(0, "anthropic_text_then_call.sse")
    with sse_upstream() as upstream:
        (result,) = Replayer(upstream.url, model="tiny-model").step([main])
    sent = upstream.requests[0].json()
    assert (sent["temperature"], sent["max_tokens"], sent["model"]) == (0, PROXY_MAX_TOKENS_CAP, "tiny-model")
    assert result.max_tokens == PROXY_MAX_TOKENS_CAP
    openai = json.loads(for_client(main, max_tokens=64, model=None, protocol="openai"))
    assert (openai["temperature"], openai["max_tokens"]) == (0, 64)


def test_the_output_tokens_and_why_the_reply_ended_come_from_the_stream():
    body = json.dumps({"stream": True}).encode()
    with sse_upstream() as upstream:
        anthropic = post_streamed(upstream.url, MESSAGES_PATH, body, headers={"x-test-fixture": "anthropic_text_then_call.sse"})
        openai = post_streamed(upstream.url, CHAT_COMPLETIONS_PATH, body, headers={"x-test-fixture": "openai_text_then_call.sse"})
    assert (anthropic.output_tokens, anthropic.stop_reason) == (57, "end_turn")
    assert (openai.output_tokens, openai.stop_reason) == (48, "stop")  # completion_tokens in the last chunk


def test_the_addons_diagnosis_line_is_taken_from_mitmdump_output():
    lines = [
        "[05:09:27.300][127.0.0.1:4242] client connect",
        "[05:09:27.357] lane main · prefix stable 12,440/13,135 B (94.7%) · first change messages[4]",
    ]
    assert _diagnosis_line(lines) == "lane main · prefix stable 12,440/13,135 B (94.7%) · first change messages[4]"
    assert _diagnosis_line(lines[:1]) is None


def test_log_follower_returns_only_complete_new_lines(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("before the replay\n")
    follower = LogFollower(log)
    with log.open("a") as out:
        out.write("first\nhalf")
    assert follower.new_lines() == ["first"]
    with log.open("a") as out:
        out.write(" written\n")
    assert follower.new_lines() == ["half written"]


def test_ttft_is_the_first_output_event_of_a_stream_cut_into_awkward_pieces():
    body = json.dumps({"stream": True}).encode()
    headers = {"x-test-fixture": "anthropic_text_then_call.sse", "x-test-pause-before": "content_block_delta", "x-test-pause-seconds": "0.3"}
    with sse_upstream() as upstream:
        reply = post_streamed(upstream.url, MESSAGES_PATH, body, headers=headers)
    assert reply.status == 200 and reply.error is None and not reply.ttft_is_total
    assert 0.3 <= reply.ttft_s < reply.total_s  # message_start came before the pause, the first delta after it
    assert reply.usage.get("output_tokens")


def test_a_refused_connection_is_a_failed_reply_not_the_replays_end():
    """The team bench's failover: one lost request is a row (status 0, its error), and the replay goes on."""
    reply = post_streamed(f"http://127.0.0.1:{free_port()}", MESSAGES_PATH, b"{}")
    assert reply.status == 0 and reply.error.startswith("connection failed")
    assert reuse_figures(reply, None, None, None) == (None, None)


def test_each_answered_request_is_told_as_it_ends_also_within_a_concurrent_step():
    answered = []
    group = [dataclasses.replace(streamed(index, "anthropic_text_then_call.sse", lane=f"sub:explore@{index}", **{AGENT_ID_HEADER: f"a{index}"}),
                                 fan_out="explore-0-1") for index in (1, 2)]
    with sse_upstream() as upstream:
        replayer = Replayer(upstream.url, reuse_sources=("usage",), on_answered=lambda request: answered.append(request.index))
        replayer.step([streamed(0, "anthropic_text_then_call.sse")])
        replayer.step(group)
    assert sorted(answered) == [0, 1, 2] and answered[0] == 0
