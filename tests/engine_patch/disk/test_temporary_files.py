"""Temporary files of writes in flight, on a directory several hosts share (issue #36, item 6): a
restarting replica removes its own host's crashed writes, never another host's write in flight."""

import os
import subprocess
import sys
import time

from stable_prefix.engine_patch.disk.snapshot_directory import (
    HOST,
    STALE_TEMP_SECONDS,
    TEMP_PREFIX,
    SnapshotDirectory,
    host_label,
)

OTHER_HOST = host_label("studio-2.local")


def dead_pid() -> int:
    """A pid no process of this host has any more."""
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    return int(finished.stdout)


def temporary(folder, host: str, pid: int, age_s: float = 0.0):
    path = folder / "blocks" / f"{TEMP_PREFIX}{host}-{pid}-{'0' * 8}-{'ab' * 16}.kvblock"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"partial")
    if age_s:
        then = time.time() - age_s
        os.utime(path, (then, then))
    return path


def test_a_temporary_file_names_its_host_and_process(tmp_path):
    final = tmp_path / "blocks" / "key.kvblock"
    assert SnapshotDirectory.temporary_for(final).name.startswith(f"{TEMP_PREFIX}{HOST}-{os.getpid()}-")


def test_a_host_name_goes_into_a_file_name_without_the_separator():
    assert host_label("mac-mini-3.local") == "mac_mini_3.local" and host_label("") == "_"


def test_a_write_of_a_process_this_host_no_longer_runs_is_stale(tmp_path):
    crashed = temporary(tmp_path, HOST, dead_pid())
    assert SnapshotDirectory(tmp_path, 10**9).stale_temporary_files(tmp_path) == [crashed]


def test_a_write_of_a_live_process_of_this_host_is_kept(tmp_path):
    temporary(tmp_path, HOST, os.getppid())
    assert SnapshotDirectory(tmp_path, 10**9).stale_temporary_files(tmp_path) == []


def test_another_hosts_write_in_flight_is_kept_whatever_runs_here(tmp_path):
    temporary(tmp_path, OTHER_HOST, dead_pid())  # its pid is free here; its writer runs on the other host
    assert SnapshotDirectory(tmp_path, 10**9).stale_temporary_files(tmp_path) == []


def test_another_hosts_temporary_file_a_day_old_is_stale(tmp_path):
    crashed = temporary(tmp_path, OTHER_HOST, dead_pid(), age_s=STALE_TEMP_SECONDS + 60)
    assert SnapshotDirectory(tmp_path, 10**9).stale_temporary_files(tmp_path) == [crashed]


def test_a_temporary_file_of_the_older_form_is_judged_by_its_age_alone(tmp_path):
    (tmp_path / "blocks").mkdir()
    recent = tmp_path / "blocks" / f"{TEMP_PREFIX}{dead_pid()}-{'0' * 8}-key.kvblock"  # `.tmp-<pid>-`: its host unknown
    recent.write_bytes(b"partial")
    assert SnapshotDirectory(tmp_path, 10**9).stale_temporary_files(tmp_path) == []
