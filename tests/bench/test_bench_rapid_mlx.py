"""Rapid-MLX 0.16.10 as an anchor, through real servers: its own venv's `vllm-mlx` script serves
the tiny model direct and behind a real mitmdump with our addon, for the first requests of the
session (a main turn with its title request beside it, then a warm turn), and the bench reads
what it reused from what Rapid-MLX itself reports."""

import json
import re
from pathlib import Path

import pytest

from stable_prefix.bench import run
from stable_prefix.bench.clients.stack import RAPID_MLX_VENV, engine_command
from tests.support.models import require_model

pytestmark = pytest.mark.server

CONFIGS = ["8-rapid-mlx", "9-rapid-mlx+addon"]


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-rapid-mlx")
    argv = [
        "--configs", "8,9", "--limit", "3", "--scale", "0.03", "--max-tokens", "12", "--overhead-samples", "0", "--incontext-configs", "",
        "--out", str(out), "--logs", str(out / "logs"), "--model", str(require_model()),
    ]
    assert run.main(argv) == 0
    return out, json.loads((out / "latest.json").read_text())


def rows_of(data, key):
    return [row for row in data["rows"] if row["configuration"] == key]


def test_both_rapid_mlx_configurations_answer_every_request(result):
    _, data = result
    assert [config["key"] for config in data["configurations"]] == CONFIGS
    assert all(config["engine"] == "rapid-mlx" and not config["ours"] for config in data["configurations"])
    assert len(data["rows"]) == 2 * 3 and all(row["status"] == 200 and row["error"] is None for row in data["rows"])
    assert all(row["output_tokens"] and row["output_tokens"] <= 12 for row in data["rows"])


def test_its_reuse_is_what_its_scheduler_logged_the_title_beside_the_main_turn_included(result):
    _, data = result
    for key in CONFIGS:
        rows = rows_of(data, key)
        assert all(row["reuse_source"] == "server-log" and 0 <= row["reused_tokens"] < row["prompt_tokens"] for row in rows)
        assert rows[1]["beside"] == 0  # sent at the same time: matched to its log line by the size its usage reported
        assert rows[2]["warm"] and rows[2]["reused_tokens"] >= rows[0]["prompt_tokens"] - 8  # the warm turn reused the first one
        assert data["configurations"][CONFIGS.index(key)]["summary"]["tokens_prefilled"] is not None


def test_its_prompts_are_not_rendered_so_its_ideal_reuse_is_unknown_not_guessed(result):
    _, data = result
    assert all(row["rendered_prompt_tokens"] is None and row["ideal_reusable_tokens"] is None for row in data["rows"])
    assert all(config["summary"]["reuse_efficiency"] is None for config in data["configurations"])


def test_each_run_starts_from_an_empty_rapid_mlx_cache_in_a_home_that_is_then_removed(result):
    out, _ = result
    assert engine_command(run.configuration("8"), require_model(), 8000)[0] == str(RAPID_MLX_VENV / "bin" / "vllm-mlx")
    for log in sorted((out / "logs").glob("*-rapid-mlx*-engine-*.log")):
        text = log.read_text(errors="replace")
        (home,) = set(re.findall(r"no index at (/\S+?)/\.cache/rapid-mlx/prefix_cache/", text))  # nothing to load at start
        assert "stable-prefix-" in home and not Path(home).exists()  # its own home, gone with its cache
