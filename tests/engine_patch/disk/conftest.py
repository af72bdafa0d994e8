"""The disk tests' own snapshot directory (tests that need a stand-in file import `a_file` from tests.support)."""

import pytest

from stable_prefix.engine_patch.disk.snapshot_directory import SnapshotDirectory


@pytest.fixture
def directory(tmp_path):
    files = SnapshotDirectory(tmp_path / "kv", 10**9)
    files.prepare()
    return files
