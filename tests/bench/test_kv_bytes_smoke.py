"""`make bench-kv` at its smallest: the bytes bench's command in process, its server mode with two engines, its report."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from stable_prefix.bench import kv_bytes
from stable_prefix.bench.clients.kv_servers import through_servers
from stable_prefix.bench.clients.stack import PRODUCT, product_of
from stable_prefix.bench.measure.kv_figures import figures
from stable_prefix.bench.workload.kv_sessions import KvSession
from stable_prefix.bench.workload.kv_shapes import SHAPES
from stable_prefix.bench.workload.session import generate_session
from tests.support.processes import REPO_ROOT

KNOWN_TODAY = ("new_token_states", "disk_bytes_written", "written_over_new", "ram_bytes_held", "ram_unique_token_states", "ram_over_unique",
               "disk_bytes_held", "disk_files", "restore_gb_per_s_ram", "restore_gb_per_s_disk", "lanes_warm_ram", "lanes_warm_disk")


@pytest.fixture(scope="module")
def in_process(tmp_path_factory):
    out = tmp_path_factory.mktemp("kv")
    assert kv_bytes.main(["--sessions", "demo", "--shapes", "tiny", "--out", str(out), "--name", "smoke"]) == 0
    return json.loads((out / "smoke.json").read_text()), (out / "smoke.md").read_text()


def test_the_demo_session_in_process_reports_every_figure_from_the_engine(in_process):
    result, _ = in_process
    (run,) = result["runs"]
    figures_ = run["figures"]
    assert {key: figures_[key] for key in KNOWN_TODAY if figures_[key] is None} == {}
    assert figures_["requests"] == 36 and figures_["lanes"] == 10
    assert figures_["bytes_per_token"] == 512
    assert figures_["written_over_new"] == pytest.approx(figures_["disk_bytes_written"] / (figures_["new_token_states"] * 512))
    assert figures_["disk_bytes_held"] <= result["budgets"]["disk_bytes"]


def test_the_report_leads_with_the_real_shape_table_and_names_each_target(in_process):
    _, markdown = in_process
    assert markdown.index("## Real shapes") < markdown.index("## Every run") < markdown.index("## Targets (issue 29)")
    target_rows = markdown.split("## Targets (issue 29)")[1]
    assert "demo | tiny" in target_rows and "unknown" not in target_rows


# How many bytes a manifest's `written_at` may print longer or shorter (a float's repr drops trailing zeros).
CLOCK_DIGITS_BYTES = 8


@pytest.mark.slow
def test_two_engines_through_servers_take_the_same_requests_and_are_paired(tmp_path):
    """This checkout's engine, and the same code from a `git archive` of its commit (run from its own folder, this venv):
    the same requests, the same bytes, their warm times paired."""
    export = tmp_path / "export"
    export.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", "HEAD"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(export)], input=archive, check=True)
    other = product_of(export)
    assert other.engine.cwd != REPO_ROOT and other.key != PRODUCT.key
    session = KvSession("smoke", "the demo session's first 6 requests", lambda scale: generate_session(0, scale)[:6], 0.04, 0.04, 8)
    try:
        runs = through_servers([PRODUCT, other], session, SHAPES["tiny"], tmp_path / "logs")
    finally:
        shutil.rmtree(other.engine.cwd)  # the export's namespace of links, in build/engine-trees/
    ours, theirs = runs[PRODUCT.key], runs[other.key]
    # The fan-out group's instances run at once: which one waits for the other's head is the moment's draw.
    assert sorted(r["reused"] for r in ours["requests"]) == sorted(r["reused"] for r in theirs["requests"])
    # The same blocks and states; each manifest records when it was written (`written_at`, a float whose printed
    # length varies by a few digits), so the two may differ by that much per manifest, at most one a request.
    written_ours, written_theirs = ours["end_stats"]["disk_bytes_written"], theirs["end_stats"]["disk_bytes_written"]
    assert written_ours > 0 and written_theirs > 0
    assert abs(written_ours - written_theirs) <= CLOCK_DIGITS_BYTES * len(ours["requests"])
    assert all(ours["restart"]["warm_on_disk"].values())
    figures_ = figures(ours, ours["sequences"], 1.0)
    assert figures_["ram_unique_token_states"] is not None and figures_["lanes_warm_ram"] == figures_["lanes"]
