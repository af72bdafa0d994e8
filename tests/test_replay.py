"""Where the replay reads each request's reuse from, in order of preference."""

from stable_prefix.bench.replay import LogFollower, Reply, _diagnosis_line, reuse_figures

HIT = "INFO:vllm_mlx.engine.simple:System KV cache HIT (stream_chat): reusing 6378 tokens, prefilling 523 new (hash=ab12)"
MISS = "INFO:vllm_mlx.engine.simple:System KV cache MISS (stream_chat): will prefill 6378 system + 15 suffix tokens (hash=ab12)"


def ok(usage=None):
    return Reply(status=200, ttft_s=0.1, total_s=0.2, usage=usage or {})


def test_usage_from_the_patched_engine_comes_first():
    usage = {"input_tokens": 300, "cache_read_input_tokens": 4000, "output_tokens": 8}
    assert reuse_figures(ok(usage), None, None, [HIT]) == ((4300, 4000), "usage")


def test_cache_stats_deltas_when_usage_has_no_reuse():
    before, after = {"tokens_reused": 100, "tokens_prefilled": 50}, {"tokens_reused": 700, "tokens_prefilled": 80}
    assert reuse_figures(ok({"output_tokens": 8}), before, after, []) == ((630, 600), "stats")


def test_shipped_vllm_mlx_hit_and_miss_log_lines():
    assert reuse_figures(ok(), None, None, ["noise", HIT]) == ((6901, 6378), "server-log")
    assert reuse_figures(ok(), None, None, [MISS]) == ((6393, 0), "server-log")


def test_no_cache_line_from_shipped_vllm_mlx_means_nothing_reused():
    assert reuse_figures(ok(), None, None, ["INFO: System KV cache SKIP (stream_chat): ..."]) == ((None, 0), "server-log")


def test_a_failed_request_has_no_reuse_figures():
    assert reuse_figures(Reply(status=500, ttft_s=None, total_s=0.1, error="HTTP 500"), None, None, []) == (None, None)


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
