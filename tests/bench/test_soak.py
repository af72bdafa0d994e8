"""`make soak` at a small scale (`bench.soak --small`): the soak through `stable-prefix up` with an engine
SIGKILLed and restarted, and the load scenario with clients giving up on purpose. Nothing lost, nothing
answered twice, budgets held at every sample, and every compared answer identical to an uncached engine's."""

import json

import pytest

from stable_prefix.bench import soak
from stable_prefix.bench.measure.resources import ProcessFigures, Sample, slope_per_1000

pytestmark = [pytest.mark.slow, pytest.mark.server]


def test_growth_per_1000_requests_is_the_least_squares_slope():
    assert slope_per_1000([(0, 10.0), (500, 15.0), (1000, 20.0)]) == pytest.approx(10.0)
    assert slope_per_1000([(0, 5.0), (10, 5.0), (20, 5.0)]) == 0
    assert slope_per_1000([(0, 1.0), (1, 2.0)]) is None


def test_the_small_soak_and_load_lose_nothing_and_answer_as_an_uncached_engine(tmp_path):
    # The default engine mode (batched): requests in flight decode together, and each answer still equals
    # the request's answer alone (the float32 bench model: no ties among its logits, docs/reliability.md).
    assert soak.main(["--small", "--out", str(tmp_path), "--no-docs"]) == 0
    run = json.loads((tmp_path / "soak.json").read_text())
    figures, load = run["soak"], run["load"]
    assert figures["requests"] == figures["complete"] == soak.SMALL.requests and figures["errors"] == []
    assert figures["engine_lives"] == 2 and len(figures["first_request_after_each_restart"]) == 1
    restart = figures["first_request_after_each_restart"][0]
    assert restart["reused"] > restart["prompt"] // 2  # warm from the killed engine's disk snapshots
    assert figures["samples"] == figures["samples_within_budgets"] >= soak.SMALL.requests // soak.SMALL.sample_every
    assert figures["compared_with_uncached"] >= soak.SMALL.requests // soak.SMALL.check_every and figures["mismatched"] == []
    assert load["completed"] > 0 and load["lost"] == [] and load["forwarded_twice"] == [] and load["mismatched"] == []
    assert load["compared_with_uncached"] == load["completed"]
    assert load["engine_queue_wait_s_max"] is not None
    assert figures["subagent_lanes"] > 0 and [life["life"] for life in figures["proxy_rss_per_life"]] == [1, 2]
    assert "**Soak**" in (tmp_path / "soak.md").read_text() and "Proxy RSS per engine life" in (tmp_path / "soak.md").read_text()


def test_the_proxy_rss_is_reported_per_engine_life_first_last_and_per_1000_requests():
    def at(requests, life, proxy_mib):
        return Sample(requests, life, ProcessFigures(0, 0, 0), ProcessFigures(proxy_mib * 2**20, 0, 0), 0, 0, None, None, None, None, None, None)

    samples = [at(1, 1, 100), at(500, 1, 105), at(1000, 1, 110), at(1001, 2, 90)]
    assert soak.proxy_rss_per_life(samples) == [
        {"life": 1, "requests": [1, 1000], "first_mib": 100.0, "last_mib": 110.0, "per_1000_requests_mib": pytest.approx(10.01, abs=0.01)},
        {"life": 2, "requests": [1001, 1001], "first_mib": 90.0, "last_mib": 90.0, "per_1000_requests_mib": None},
    ]
