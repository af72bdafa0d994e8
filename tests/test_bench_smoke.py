"""A `make bench QUICK=1`-sized replay, end to end: real vllm-mlx servers (as
shipped, and patched behind a real mitmdump with our addon), every output file
written, and the product reusing more of the prompt than vllm-mlx as shipped."""

import json

import pytest

from stable_prefix.bench import run
from tests.support.models import require_model

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    argv = ["--configs", "1,4", "--limit", "10", "--scale", "0.03", "--overhead-samples", "5", "--out", str(out), "--logs", str(out / "logs"), "--model", str(require_model())]
    assert run.main(argv) == 0
    return out, json.loads((out / "latest.json").read_text())


def by_key(result_json):
    return {config["key"]: config["summary"] for config in result_json["configurations"]}


def test_every_output_file_is_written(result):
    out, _ = result
    table_rows = [line.split(":")[0] for line in (out / "latest.md").read_text().splitlines() if line.startswith("| ") and ": " in line]
    assert table_rows == ["| 1-shipped", "| 4-patched+addon"]
    assert (out / "latest.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_json_has_rows_for_every_request_of_every_configuration_and_the_summary_fields(result):
    _, data = result
    assert len(data["rows"]) == 2 * 10
    assert all(row["status"] == 200 and row["error"] is None for row in data["rows"])
    for summary in by_key(data).values():
        assert {"cold_ttft_median_s", "warm_ttft_median_s", "reuse_efficiency", "proxy_overhead_ms_p50"} <= summary.keys()
    assert by_key(data)["4-patched+addon"]["proxy_overhead_ms_p50"] is not None
    assert by_key(data)["1-shipped"]["proxy_overhead_ms_p50"] is None


def test_warm_product_requests_are_compared_with_prefilling_their_new_tokens_in_context(result):
    _, data = result
    product_warm = [row for row in data["rows"] if row["configuration"] == "4-patched+addon" and row["warm"]]
    assert product_warm and all(row["incontext_prefill_s"] > 0 for row in product_warm)
    assert by_key(data)["4-patched+addon"]["warm_ttft_over_incontext_prefill_median"] > 0
    # Only the patched engine is measured by default; the shipped one's stays unknown, not made up.
    assert all(row["incontext_prefill_s"] is None for row in data["rows"] if row["configuration"] == "1-shipped")
    assert by_key(data)["1-shipped"]["warm_ttft_over_incontext_prefill_median"] is None


def test_proxy_overhead_reports_added_ttft_and_instant_upstream_total_for_every_variant(result):
    _, data = result
    overhead = data["proxy_overhead"]
    for variant in ("mitmproxy_alone", "addon", "addon_without_diagnosis", "addon_with_capture"):
        for figure in ("added_ttft_ms", "added_total_instant_upstream_ms"):
            assert overhead[variant][figure]["samples"] == 5
            assert overhead[variant][figure]["p50"] is not None
    product = by_key(data)["4-patched+addon"]
    assert product["proxy_overhead_ms_p50"] == overhead["addon"]["added_ttft_ms"]["p50"]
    assert product["proxy_overhead_total_instant_upstream_ms_p50"] == overhead["addon"]["added_total_instant_upstream_ms"]["p50"]


def test_product_reuses_more_than_vllm_mlx_as_shipped(result):
    _, data = result
    shipped, product = by_key(data)["1-shipped"], by_key(data)["4-patched+addon"]
    assert product["reuse_efficiency"] > shipped["reuse_efficiency"]
    assert product["tokens_prefilled"] < shipped["tokens_prefilled"]


def test_the_ideal_baseline_renders_the_prompts_the_servers_prefilled(result):
    # The ideal-reuse baseline is only right if our rendering is token-exact.
    _, data = result
    for row in data["rows"]:
        assert row["rendered_prompt_tokens"] == row["prompt_tokens"], row


def test_the_product_rows_carry_the_addons_diagnosis(result):
    _, data = result
    product_rows = [row for row in data["rows"] if row["configuration"] == "4-patched+addon"]
    assert all(row["diagnosis"] and row["diagnosis"].startswith("lane ") for row in product_rows)
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
