"""The team bench at its smallest, end to end: two users at once, each through their own real mitmdump,
into one replica alone and into two patched replicas behind real HAProxy on our key; the report's shape and
the invariants that hold only if the bench measured what it says."""

import json

import pytest

from stable_prefix.bench import team
from tests.support.models import require_model

pytestmark = [pytest.mark.server, pytest.mark.slow]

CONFIGS = ["alone", "key-haproxy"]
USERS, REQUESTS = 2, 6  # per user: main, its title beside it, two main turns, two Explore instances at once


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-team")
    argv = ["--configs", ",".join(CONFIGS), "--users", str(USERS), "--limit", str(REQUESTS), "--out", str(out),
            "--logs", str(out / "logs"), "--model", str(require_model())]
    assert team.main(argv) == 0
    return out, json.loads((out / "latest.json").read_text())


def test_the_report_has_a_row_per_configuration_and_every_section(result):
    out, _ = result
    report = (out / "latest.md").read_text()
    per_configuration = report.split("## Per configuration", 1)[1].split("\n## ", 1)[0]
    table = [line for line in per_configuration.splitlines() if line.startswith("| `")]
    assert [line.split("`")[1] for line in table] == CONFIGS
    for heading in ("## Per configuration", "## The routing key", "## Failover", "## What a user loses", "## Balance", "## Targets"):
        assert heading in report


def test_no_request_is_lost(result):
    _, data = result
    assert all(config["requests_lost"] == 0 for config in data["configurations"].values())
    assert all(row["status"] == 200 and row["stop_reason"] for rows in data["rows"].values() for row in rows)


def test_every_request_is_placed_on_the_replica_that_logged_it(result):
    _, data = result
    for config in data["configurations"].values():
        assert config["placement_unknown"] == 0
        assert sum(replica["requests"] for replica in config["replicas"].values()) == config["requests"] == USERS * REQUESTS


def test_the_engines_own_logs_and_the_usage_agree_on_tokens_prefilled(result):
    _, data = result
    for config in data["configurations"].values():
        assert sum(replica["tokens_prefilled"] for replica in config["replicas"].values()) == config["tokens_prefilled"] > 0


def test_under_the_key_every_lane_stays_on_one_replica(result):
    _, data = result
    lanes = data["configurations"]["key-haproxy"]["lanes_on_one_replica"]
    assert lanes["lanes"] >= USERS  # each user's main lane at least
    assert lanes["on_one_replica"] == lanes["lanes"]


def test_warm_turns_reuse_what_the_previous_turn_left(result):
    _, data = result
    for rows in data["rows"].values():
        warm_main = [row for row in rows if row["lane"] == "main" and row["warm"]]
        assert warm_main and all(row["reused_tokens"] > 0.8 * row["prompt_tokens"] for row in warm_main)
