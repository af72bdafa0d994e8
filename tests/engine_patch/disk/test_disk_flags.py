"""The disk tier's flags and their environment equivalents, as `serve` reads them."""

import subprocess
import sys
from pathlib import Path

import pytest

from stable_prefix.engine_patch.__main__ import our_flags
from stable_prefix.engine_patch.disk.disk_tier import DEFAULT_DIRECTORY
from tests.support.processes import REPO_ROOT


@pytest.fixture
def clean_environment(monkeypatch):
    for name in ("ENGINE_PATCH_PREFIX_CACHE_DIR", "ENGINE_PATCH_PREFIX_CACHE_DISK_BYTES", "ENGINE_PATCH_NO_DISK_CACHE"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_by_default_snapshots_go_to_the_user_cache_directory(clean_environment):
    options, rest = our_flags().parse_known_args(["model", "--port", "8000"])
    assert options.prefix_cache_dir == DEFAULT_DIRECTORY and DEFAULT_DIRECTORY.parts[-2:] == ("stable-prefix", "kv")
    assert options.prefix_cache_disk_bytes is None and options.no_disk_cache is False
    assert rest == ["model", "--port", "8000"]


def test_flags_set_the_directory_budget_and_switch(clean_environment):
    options, _ = our_flags().parse_known_args(["--prefix-cache-dir", "/tmp/kv", "--prefix-cache-disk-bytes", "2GiB", "--no-disk-cache"])
    assert options.prefix_cache_dir == Path("/tmp/kv") and options.prefix_cache_disk_bytes == 2 * 2**30 and options.no_disk_cache


def test_the_environment_sets_them_too(clean_environment):
    clean_environment.setenv("ENGINE_PATCH_PREFIX_CACHE_DIR", "/srv/kv")
    clean_environment.setenv("ENGINE_PATCH_NO_DISK_CACHE", "1")
    options, _ = our_flags().parse_known_args([])
    assert Path(options.prefix_cache_dir) == Path("/srv/kv") and options.no_disk_cache


def test_a_malformed_disk_budget_is_refused_with_the_flag_named():
    result = subprocess.run([sys.executable, "-m", "stable_prefix.engine_patch", "serve", "model", "--prefix-cache-disk-bytes", "big"],
                            capture_output=True, text=True, cwd=REPO_ROOT)
    assert result.returncode != 0 and "--prefix-cache-disk-bytes: 'big' is not a size" in result.stderr
