"""No capture record ever replaces another: claimed session folders, continued numbering, linked files."""

from __future__ import annotations

import contextlib
import json
import logging
import os

import pytest
from mitmproxy import hooks
from mitmproxy.test import taddons

from stable_prefix.addons import capture as capture_module
from stable_prefix.addons.capture import Capture
from stable_prefix.addons.capture_folder import PRIVATE_FILE_MODE, claim_new_session, create_private, last_record_number, write_record
from tests.support.messages_flows import api_flow, json_response
from tests.support.proxy_addons import NO_RULES, DiagnosedCapture


def record_one(addon, content: str = "hello") -> None:
    flow = api_flow({"model": "m", "messages": [{"role": "user", "content": content}]})
    addon.request(flow)
    json_response(flow, {})
    addon.response(flow)


def records(folder) -> list[tuple[str, int, str]]:
    found = []
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text())
        found.append((path.name, record["seq"], record["client_body"]["messages"][0]["content"]))
    return found


@contextlib.contextmanager
def two_proxies(tmp_path, **options):
    """Two capture addons on the same options, as two mitmdump processes given the same command line (each with the
    one diagnosis before it, which names the record's lane)."""
    first, second = DiagnosedCapture(), DiagnosedCapture()
    with taddons.context(first) as tctx:
        tctx.configure(first, capture_dir=str(tmp_path), **NO_RULES, **options)
        # The other process reads the same options.
        tctx.master.addons.invoke_addon_sync(second, hooks.ConfigureHook({"capture_dir", "capture_session"}))
        yield first, second


def test_two_proxies_started_in_the_same_second_get_a_session_folder_each(tmp_path, monkeypatch):
    monkeypatch.setattr(capture_module, "session_name_now", lambda: "20261201-093000")
    with two_proxies(tmp_path) as (first, second):
        record_one(first, "from the first")
        record_one(second, "from the second")
    assert records(tmp_path / "20261201-093000") == [("0001-side-965259.json", 1, "from the first")]
    assert records(tmp_path / "20261201-093000-2") == [("0001-side-965259.json", 1, "from the second")]


def test_two_proxies_writing_one_named_session_never_overwrite_each_other(tmp_path):
    with two_proxies(tmp_path, capture_session="shared") as (first, second):
        for turn in range(3):
            record_one(first, f"first {turn}")
            record_one(second, f"second {turn}")
    found = records(tmp_path / "shared")
    assert [seq for _, seq, _ in found] == [1, 2, 3, 4, 5, 6]
    assert sorted(content for _, _, content in found) == sorted(f"{who} {turn}" for who in ("first", "second") for turn in range(3))


def test_a_restart_with_a_fixed_session_continues_after_the_last_record_and_says_the_diagnosis_starts_fresh(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    with two_proxies(tmp_path, capture_session="fixed") as (before, _):
        record_one(before, "before 1")
        record_one(before, "before 2")
        after = Capture()  # the restarted proxy: nothing of the first one's state
        after.configure({"capture_dir", "capture_session"})
        record_one(after, "after 1")
        record_one(after, "after 2")
    assert [(seq, content) for _, seq, content in records(tmp_path / "fixed")] == [(1, "before 1"), (2, "before 2"), (3, "after 1"), (4, "after 2")]
    assert "already holds records up to #2: continuing at #3, none is replaced" in caplog.text
    assert "The prefix diagnosis starts fresh: each lane's next request is diagnosed as its first." in caplog.text


def test_a_record_that_cannot_be_written_is_logged_and_leaves_nothing_behind(tmp_path, caplog):
    (tmp_path / "blocked").write_text("a file where the session folder should be")
    addon = Capture()
    with taddons.context(addon) as tctx:
        tctx.configure(addon, capture_dir=str(tmp_path), capture_session="blocked")
        record_one(addon)
    assert "capture: request #1 was not recorded in " in caplog.text and "the request itself was not affected" in caplog.text
    assert sorted(path.name for path in tmp_path.iterdir()) == ["blocked"]


def test_create_private_refuses_a_name_that_exists_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "0001-main.json"
    create_private(path, b"first")
    with pytest.raises(FileExistsError):
        create_private(path, b"second")
    assert path.read_bytes() == b"first" and [p.name for p in tmp_path.iterdir()] == ["0001-main.json"]
    assert os.stat(path).st_mode & 0o777 == PRIVATE_FILE_MODE


def test_write_record_moves_to_the_next_free_number_when_another_lane_holds_it(tmp_path):
    (tmp_path / "0007-side-title.json").write_text("{}")
    seq, size = write_record(tmp_path, 7, "main", lambda seq: json.dumps({"seq": seq}).encode())
    assert (seq, size) == (8, len(b'{"seq": 8}'))
    assert json.loads((tmp_path / "0008-main.json").read_text()) == {"seq": 8}
    assert last_record_number(tmp_path) == 8


def test_claiming_a_session_folder_never_takes_one_that_exists(tmp_path):
    assert [claim_new_session(tmp_path, "s").name for _ in range(3)] == ["s", "s-2", "s-3"]
