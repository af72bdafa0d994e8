"""The capture folder's budget: oldest sessions go first, never the current one, and the log says what went."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import pytest
from mitmproxy import exceptions
from mitmproxy.test import taddons

from stable_prefix.addons.capture import DEFAULT_MAX_AGE_DAYS, DEFAULT_MAX_BYTES, Capture
from stable_prefix.addons.capture_budget import DAY_S, Budget, enforce
from tests.support.messages_flows import api_flow, json_response

NOW = 1_800_000_000.0
RECORD = 10_000  # bytes per record in these sessions


def session(root: Path, name: str, records: int, last_write: float, *, logs: bool = False) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    for number in range(1, records + 1):
        path = folder / f"{number:04d}-main.json"
        path.write_bytes(b"x" * RECORD)
        os.utime(path, (last_write - records + number, last_write - records + number))
    if logs:
        (folder / "logs").mkdir()
        (folder / "logs" / "proxy-8080.log").write_bytes(b"log\n" * 100)
        os.utime(folder / "logs" / "proxy-8080.log", (last_write, last_write))
    return folder


def names(root: Path) -> list[str]:
    return sorted(path.name for path in root.iterdir())


def test_over_the_byte_limit_the_least_recently_written_sessions_go_first(tmp_path):
    session(tmp_path, "a-oldest", 5, NOW - 3000)
    session(tmp_path, "b-older", 5, NOW - 2000, logs=True)
    session(tmp_path, "c-recent", 5, NOW - 1000)
    current = session(tmp_path, "d-current", 5, NOW)
    lines, stored = enforce(tmp_path, current, Budget(max_bytes=12 * RECORD), now=NOW)
    assert names(tmp_path) == ["c-recent", "d-current"]
    assert stored == 10 * RECORD
    assert len(lines) == 2
    assert lines[0].startswith("capture: removed session a-oldest (5 records, ")
    assert lines[1].startswith("capture: removed session b-older (5 records, ")  # its server logs went with it
    assert "over capture_max_bytes (0.1 MiB)" in lines[0]


def test_within_the_byte_limit_nothing_is_removed(tmp_path):
    session(tmp_path, "a", 5, NOW - 3000)
    current = session(tmp_path, "b", 5, NOW)
    assert enforce(tmp_path, current, Budget(max_bytes=10 * RECORD), now=NOW) == ([], 10 * RECORD)
    assert names(tmp_path) == ["a", "b"]


def test_a_removal_frees_down_to_the_low_water_mark_so_the_next_record_does_not_rescan(tmp_path):
    for index in range(10):
        session(tmp_path, f"s{index}", 1, NOW - 1000 + index)
    current = session(tmp_path, "s9-current", 1, NOW)
    lines, stored = enforce(tmp_path, current, Budget(max_bytes=10 * RECORD), now=NOW)
    assert stored <= 9 * RECORD and len(lines) == 2


def test_sessions_older_than_the_age_limit_go_and_the_current_one_never(tmp_path):
    session(tmp_path, "old", 2, NOW - 15 * DAY_S)
    session(tmp_path, "young", 2, NOW - 13 * DAY_S)
    current = session(tmp_path, "current-but-old", 2, NOW - 30 * DAY_S)  # a proxy running for a month
    lines, _ = enforce(tmp_path, current, Budget(max_age_days=14), now=NOW)
    assert names(tmp_path) == ["current-but-old", "young"]
    [line] = lines
    assert line.startswith("capture: removed session old (2 records, ") and line.endswith("older than capture_max_age_days=14")


def test_the_current_session_alone_over_the_limit_loses_its_oldest_records(tmp_path):
    current = session(tmp_path, "current", 10, NOW)
    lines, stored = enforce(tmp_path, current, Budget(max_bytes=5 * RECORD), now=NOW)
    assert names(current) == [f"{number:04d}-main.json" for number in range(7, 11)]
    assert stored == 4 * RECORD
    assert lines == ["capture: removed the 6 oldest records of this session (#1-#6, 0.1 MiB): it alone is over capture_max_bytes (0.0 MiB)"]


def test_files_the_capture_addon_did_not_write_are_kept_with_their_folder(tmp_path):
    kept = session(tmp_path, "mine-and-yours", 3, NOW - 5000)
    (kept / "notes.txt").write_text("the user's own file")
    (kept / "0001-main.json.bak").write_text("not a record either")
    current = session(tmp_path, "current", 1, NOW)
    [line] = enforce(tmp_path, current, Budget(max_bytes=2 * RECORD), now=NOW)[0]
    assert sorted(path.name for path in kept.iterdir()) == ["0001-main.json.bak", "notes.txt"]
    assert line.endswith("; the folder stays, it holds files the capture addon did not write")


def test_other_folders_contents_under_the_root_are_not_sessions_to_count(tmp_path):
    (tmp_path / "README").write_text("a file beside the sessions")
    current = session(tmp_path, "current", 1, NOW)
    assert enforce(tmp_path, current, Budget(max_bytes=RECORD), now=NOW) == ([], RECORD)


# --- the addon's options and its checks ----------------------------------------------------------


def test_captures_are_bounded_by_default():
    assert (DEFAULT_MAX_BYTES, DEFAULT_MAX_AGE_DAYS) == ("2g", 14)
    addon = Capture()
    with taddons.context(addon) as tctx:
        tctx.configure(addon, capture_max_bytes=DEFAULT_MAX_BYTES)
        assert addon.budget == Budget(max_bytes=2 * 1024**3, max_age_days=14)


@pytest.mark.parametrize(("option", "value", "message"), [
    ("capture_max_bytes", "lots", "capture_max_bytes='lots': not a size (examples: 2g, 500m, 0 for no limit)"),
    ("capture_max_bytes", "-5", "capture_max_bytes='-5': must be 0 (no limit) or a size such as 2g"),
    ("capture_max_age_days", -1, "capture_max_age_days=-1: must be 0 (no limit) or a number of days"),
])
def test_a_bad_budget_is_refused_naming_the_option(option, value, message):
    addon = Capture()
    with taddons.context(addon) as tctx, pytest.raises(exceptions.OptionsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        tctx.configure(addon, **{option: value})


def test_zero_turns_both_limits_off(tmp_path):
    session(tmp_path, "ancient", 3, time.time() - 400 * DAY_S)
    addon = Capture()
    with taddons.context(addon) as tctx:
        tctx.configure(addon, capture_dir=str(tmp_path), capture_session="now", capture_max_bytes="0", capture_max_age_days=0)
        addon.running()
        assert addon.pruning is None
    assert names(tmp_path) == ["ancient"]


def test_at_start_and_when_a_record_passes_the_limit_the_addon_removes_and_logs(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    session(tmp_path, "ancient", 3, time.time() - 30 * DAY_S)
    session(tmp_path, "yesterday", 3, time.time() - DAY_S)
    addon = Capture()
    with taddons.context(addon) as tctx:
        tctx.configure(addon, capture_dir=str(tmp_path), capture_session="today", capture_max_bytes="40k")
        addon.running()
        addon.pruning.join()
        assert names(tmp_path) == ["yesterday"]
        assert "capture: removed session ancient (3 records, " in caplog.text and "older than capture_max_age_days=14" in caplog.text
        for _ in range(2):
            flow = api_flow({"model": "m", "messages": [{"role": "user", "content": "x" * 6000}]})
            addon.request(flow)
            json_response(flow, {})
            addon.response(flow)
            addon.pruning.join()
    assert names(tmp_path) == ["today"]
    assert "capture: removed session yesterday (3 records, " in caplog.text
    assert [json.loads(path.read_text())["seq"] for path in sorted((tmp_path / "today").iterdir())] == [1, 2]
