"""A `make bench QUICK=1`-sized replay, end to end: real vllm-mlx servers (as
shipped; patched behind a real mitmdump with our addon; --continuous-batching
behind the addon), the fan-out group sent concurrently, every output file
written, and figures that hold only if the bench measured what it says."""

import json
import statistics

import pytest

from stable_prefix.bench import run
from tests.support.models import require_model

pytestmark = pytest.mark.server

CONFIGS = ["1-shipped", "4-patched+addon", "7-batched+addon"]
SESSION_REQUESTS = 7  # main, title, two main turns, one Explore call of three turns


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    argv = [
        "--configs", "1,4,7", "--limit", str(SESSION_REQUESTS), "--scale", "0.03", "--max-tokens", "4", "--overhead-samples", "5",
        "--out", str(out), "--logs", str(out / "logs"), "--model", str(require_model()),
    ]
    assert run.main(argv) == 0
    return out, json.loads((out / "latest.json").read_text())


def by_key(result_json):
    return {config["key"]: config["summary"] for config in result_json["configurations"]}


def rows_of(data, key):
    return [row for row in data["rows"] if row["configuration"] == key]


def test_every_output_file_is_written(result):
    out, _ = result
    lines = (out / "latest.md").read_text().splitlines()
    first_table = lines[lines.index(next(line for line in lines if line.startswith("| configuration |"))) + 2 :]
    table_rows = [line.split(":")[0] for line in first_table[: first_table.index("")]]
    assert table_rows == [f"| {key}" for key in CONFIGS]
    assert (out / "latest.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (out / "latest.md").read_text()
    assert "Targets (issue 16), the product (4-patched+addon) in this run:" in report
    assert "| figure | 7-batched+addon |" in report  # the paired ratios against the anchor in the run


def test_json_has_rows_for_every_request_of_every_configuration_fan_out_included(result):
    _, data = result
    fan_out = data["session"]["fan_out"]
    assert fan_out["groups"] >= 1 and fan_out["instances"] >= 2 * fan_out["groups"]
    assert len(data["rows"]) == len(CONFIGS) * data["session"]["requests"]
    assert all(row["status"] == 200 and row["error"] is None for row in data["rows"])
    for summary in by_key(data).values():
        assert summary["fan_out_requests"] == fan_out["requests"] and summary["fan_out_wall_s"] > 0


def test_every_reply_is_timed_to_its_end_and_counted_in_output_tokens(result):
    _, data = result
    assert data["replay"]["temperature"] == 0 and data["replay"]["max_tokens"] == 4
    for row in data["rows"]:
        assert 1 <= row["output_tokens"] <= row["max_tokens"] == 4 and row["total_s"] >= row["ttft_s"], row


def test_the_product_and_the_anchor_behind_the_addon_decode_the_same_replies(result):
    # The same normalized prompts, greedy: turn times compare at equal output length.
    _, data = result
    anchor = data["comparison"]["anchors"]["7-batched+addon"]
    assert anchor["output_agreement"]["equal"] == anchor["output_agreement"]["requests"] == data["session"]["requests"]
    assert anchor["paired_turn_ratio"]["all"]["rescaled"] == 0 and anchor["paired_turn_ratio"]["all"]["requests"] > 0


def test_the_title_goes_out_beside_the_first_main_turn(result):
    _, data = result
    for key in CONFIGS:
        main, title = rows_of(data, key)[:2]
        assert title["lane"] == "title" and title["beside"] == main["index"] == 0
        assert main["started_s"] <= title["started_s"] < main["started_s"] + main["total_s"]


def test_the_fan_out_instances_are_sent_at_the_same_time(result):
    _, data = result
    for key in CONFIGS:
        firsts: dict[tuple[str, str], dict] = {}
        for row in rows_of(data, key):
            if row["fan_out"]:
                firsts.setdefault((row["fan_out"], row["agent_id"]), row)  # each instance's first turn
        for group in {group for group, _ in firsts}:
            turns = [row for (each, _), row in firsts.items() if each == group]
            assert len(turns) >= 2
            assert max(row["started_s"] for row in turns) < min(row["started_s"] + row["total_s"] for row in turns), (key, group)


def test_the_ideal_baseline_renders_the_prompts_every_server_prefilled(result):
    # Reuse efficiency is only right if our rendering is token-exact, for each engine's own prompts.
    _, data = result
    for row in data["rows"]:
        assert row["rendered_prompt_tokens"] == row["prompt_tokens"], row


def test_no_sequential_request_reuses_more_than_an_ideal_cache_could(result):
    _, data = result
    for row in data["rows"]:
        if not row["fan_out"] and row["reused_tokens"] is not None:
            assert row["reused_tokens"] <= row["ideal_reusable_tokens"], row


def test_the_batched_anchors_reuse_comes_from_its_scheduler_log(result):
    _, data = result
    sequential = [row for row in rows_of(data, "7-batched+addon") if not row["fan_out"]]
    assert all(row["reuse_source"] == "server-log" and row["reused_tokens"] is not None for row in sequential)
    assert any(row["reused_tokens"] > 0 for row in sequential)
    # Fan-out rows: matched by prompt size, or unknown, never guessed.
    assert all(row["reuse_source"] in ("server-log", None) for row in rows_of(data, "7-batched+addon"))


def test_warm_product_requests_take_longer_than_the_compute_of_their_new_tokens(result):
    _, data = result
    product_warm = [row for row in rows_of(data, "4-patched+addon") if row["warm"] and not row["fan_out"]]
    assert product_warm and all(row["incontext_prefill_s"] is not None for row in product_warm)
    # A yardstick that timed the whole prompt instead of its new tokens would come out above the warm TTFT.
    assert statistics.median(row["ttft_s"] / row["incontext_prefill_s"] for row in product_warm) > 1
    # Not measured for vllm-mlx as shipped by default: unknown, not made up.
    assert all(row["incontext_prefill_s"] is None for row in rows_of(data, "1-shipped"))


def test_proxy_overhead_reports_every_variant_and_the_addons_own_share_with_an_interval(result):
    _, data = result
    overhead = data["proxy_overhead"]
    for variant in ("mitmproxy_alone", "addon", "addon_without_diagnosis", "addon_with_capture", "addon_own_share"):
        for figure in ("added_ttft_ms", "added_total_instant_upstream_ms"):
            stats = overhead[variant][figure]
            assert stats["samples"] == 5
            low, high = stats["p50_ci95"]
            assert low <= stats["p50"] <= high
            assert stats["within_noise"] == (low <= 0 <= high)
    product = by_key(data)["4-patched+addon"]
    assert product["proxy_overhead_ms_p50"] == overhead["addon"]["added_ttft_ms"]["p50"]
    assert by_key(data)["1-shipped"]["proxy_overhead_ms_p50"] is None


def test_product_prefills_less_than_vllm_mlx_as_shipped(result):
    _, data = result
    shipped, product = by_key(data)["1-shipped"], by_key(data)["4-patched+addon"]
    assert product["tokens_prefilled"] < shipped["tokens_prefilled"]


def test_the_product_rows_carry_the_addons_diagnosis_and_their_reuse_from_usage(result):
    _, data = result
    product_rows = rows_of(data, "4-patched+addon")
    accompanied = {row["beside"] for row in product_rows if row["beside"] is not None}
    sent_alone = [row for row in product_rows if not row["fan_out"] and row["beside"] is None and row["index"] not in accompanied]
    assert sent_alone and all(row["diagnosis"] and row["diagnosis"].startswith("lane ") for row in sent_alone)
    assert all(row["reuse_source"] == "usage" for row in product_rows)


def test_demo_stops_both_servers_on_ctrl_c(tmp_path):
    import re
    import signal
    import subprocess
    import sys
    import time

    from tests.support.processes import REPO_ROOT, port_open

    demo = subprocess.Popen(
        [sys.executable, "-m", "stable_prefix.bench.demo", "--scale", "0.03", "--model", str(require_model()), "--logs", str(tmp_path)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # A Ctrl-C as from a terminal: a suite started in the background (`make test &`) ignores SIGINT,
        # its children inherit that, and Python raises no KeyboardInterrupt for an ignored signal.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        output = ""
        while "Started:" not in output:
            line = demo.stdout.readline()
            assert line, f"demo ended before starting its servers:\n{output}"
            output += line
        ports = [int(port) for port in re.findall(r"127\.0\.0\.1:(\d+)", output.split("Started:", 1)[1])]
        assert len(ports) == 2 and all(port_open(port) for port in ports)
        demo.send_signal(signal.SIGINT)
        remaining, _ = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
    assert demo.returncode == 130, remaining
    assert "interrupted: both servers stopped" in remaining
    time.sleep(0.5)
    assert not any(port_open(port) for port in ports)
