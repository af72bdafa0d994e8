"""The faults the disk tier's index and writer both count (`disk_faults.py`): logged once per kind, counted every time."""

import logging
import threading

from stable_prefix.engine_patch.disk.disk_faults import DiskCounters, DiskFaults


def faults() -> DiskFaults:
    return DiskFaults(DiskCounters(), threading.Condition())


def test_a_fault_is_a_warning_the_first_time_and_counted_every_time(caplog):
    reported = faults()
    with caplog.at_level(logging.DEBUG, logger="engine_patch"):
        for _ in range(3):
            reported.count_error("writing a lane; it is kept in RAM only", OSError(28, "No space left on device"))
    assert reported.counters.errors == 3
    assert "No space left" in reported.counters.last_error
    assert [record.levelno for record in caplog.records] == [logging.WARNING, logging.DEBUG, logging.DEBUG]


def test_a_block_found_gone_twice_is_counted_once(tmp_path):
    reported = faults()
    reported.block_gone(tmp_path / "blocks" / "a.kv")
    reported.block_gone(tmp_path / "blocks" / "a.kv")
    assert reported.counters.blocks_missing == 1


def test_a_bad_file_is_deleted_and_whoever_read_it_is_told(tmp_path):
    reported, told = faults(), []
    reported.on_deleted.append(told.append)
    bad = tmp_path / "bad.kv"
    bad.write_bytes(b"not a snapshot")
    reported.delete_bad_file(bad)
    reported.delete_bad_file(tmp_path / "gone already.kv")
    assert not bad.exists() and told == [bad, tmp_path / "gone already.kv"]
