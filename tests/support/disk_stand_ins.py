"""What the disk tier's write-plan tests write: a stand-in snapshot file (their directory: tests/engine_patch/disk/conftest.py)."""

from stable_prefix.engine_patch.disk.snapshot_file import prepare_snapshot


def a_file() -> object:
    return prepare_snapshot("state", "test", {}, {"what": "a stand-in"})
