"""`--draft auto|on|off` through real patched servers (the tiny Qwen2 test model, whose greedy answer to a
repeated greeting repeats itself): with drafts on, both engine modes answer exactly what drafts off
answers, in fewer forward passes than tokens, and /v1/cache/stats says so; auto measures its verify-cost
curve at start and says what it decided and why; `stable-prefix up --draft` hands the mode to its engine."""

from __future__ import annotations

import pytest

from stable_prefix.model_servers.vllm_mlx import engine_command
from stable_prefix.stack import parse_options
from tests.support.engines import engine
from tests.support.llm_client import cache_stats, send

BODY = {"model": "tiny", "max_tokens": 48, "temperature": 0, "messages": [{"role": "user", "content": "hello " * 20}]}
DRAFT_FIELDS = ("decode_steps", "decode_tokens", "decode_steps_per_token", "draft_verify_steps", "draft_proposed", "draft_accepted",
                "draft_bypassed", "draft_mode", "draft_decision")


@pytest.fixture(scope="module")
def drafts_off(tmp_path_factory):
    with engine(tmp_path_factory.mktemp("drafts-off"), "drafts-off", "--engine", "batched", "--draft", "off", "--no-disk-cache") as server:
        answer = send(server.url, "/v1/chat/completions", BODY).text
        yield answer, cache_stats(server.url)


@pytest.mark.server
@pytest.mark.parametrize("mode", ["batched", "simple"])
def test_drafts_on_answer_as_drafts_off_in_fewer_forwards_and_the_stats_say_so(mode, drafts_off, tmp_path_factory):
    expected, off_stats = drafts_off
    with engine(tmp_path_factory.mktemp(f"drafts-on-{mode}"), f"drafts-on-{mode}", "--engine", mode, "--draft", "on", "--no-disk-cache") as server:
        answer = send(server.url, "/v1/chat/completions", BODY).text
        stats = cache_stats(server.url)
    assert answer == expected
    assert all(field in stats for field in DRAFT_FIELDS)
    assert stats["draft_accepted"] > 0 and stats["decode_steps"] < stats["decode_tokens"], stats
    assert stats["draft_decision"]["mode"] == "on"
    assert off_stats["draft_proposed"] == 0 and off_stats["decode_steps"] == off_stats["decode_tokens"] > 0
    assert off_stats["draft_decision"] == {"mode": "off", "drafting": "off", "reason": "--draft off"}


@pytest.mark.server
def test_auto_reports_the_curve_it_measured_at_start_and_its_decision(tmp_path_factory, drafts_off):
    expected, _ = drafts_off
    with engine(tmp_path_factory.mktemp("drafts-auto"), "drafts-auto", "--engine", "batched", "--no-disk-cache") as server:
        before = cache_stats(server.url)["draft_decision"]  # measured when the model was loaded, before any request
        answer = send(server.url, "/v1/chat/completions", BODY).text
        stats = cache_stats(server.url)
    assert answer == expected
    assert before["mode"] == "auto" and before["verify_cost"]["source"].startswith("measured")
    assert before["drafting"] in ("off", "per request, from its acceptance") and before["reason"]
    assert set(before["break_even_acceptance"]) == {str(k) for k in range(1, 9)}
    assert stats["decode_tokens"] > 0


def test_up_hands_its_draft_mode_to_the_engine_and_refuses_it_as_an_engine_flag(tmp_path):
    options = parse_options([str(tmp_path), "--draft", "off"])
    assert engine_command(options, 8000)[-2:] == ["--draft", "off"]
    assert engine_command(parse_options([str(tmp_path)]), 8000)[-2:] == ["--draft", "auto"]
    with pytest.raises(Exception, match="--draft"):
        parse_options([str(tmp_path), "--", "--draft", "on"])
