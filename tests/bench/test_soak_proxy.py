"""bench/soak_proxy.py: the soak's workload through one real mitmdump before a stand-in engine, its RSS sampled."""

from __future__ import annotations

import pytest

from stable_prefix.bench.soak_proxy import run


@pytest.mark.server
def test_a_short_run_sends_new_subagent_lanes_through_one_proxy_and_samples_its_memory(tmp_path):
    result = run(requests_total=150, scale=0.05, sample_every=25, out=tmp_path)
    assert result["subagent_lanes"] >= 10, "a new subagent instance every ~7 requests"
    assert [sent for sent, _ in result["samples"]] == [25, 50, 75, 100, 125, 150]
    assert 10 < result["first_mib"] <= result["max_mib"] and result["per_1000_requests_mib_whole_run"] is not None
    assert (tmp_path / "soak_proxy.json").exists()
