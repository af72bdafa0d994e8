"""The wheel built from this checkout (a module-scoped fixture: `tests/stable_prefix/conftest.py` serves it to the
packaging and proxy-only install tests), and a script that imports every module of a package installed from it."""

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support.processes import REPO_ROOT


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # Built from a copy of what the wheel is made of: setuptools reuses the checkout's build/lib, where an older copy
    # of a file (another checkout's, when build/ is shared) would go into the wheel.
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO_ROOT / name, source / name)
    for folder in tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values():
        shutil.copytree(REPO_ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__", "results"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--quiet", "-w", str(out)],
                   check=True, capture_output=True, timeout=600)
    [built] = out.glob("stable_prefix-*.whl")
    return built


# Imports every module of the installed package but the entry points (`__main__`, which run a command): prints the
# modules imported, and says which failed.
IMPORT_EVERY_MODULE = """
import importlib, pathlib, sys, stable_prefix
root = pathlib.Path(stable_prefix.__file__).parent
failed = []
for path in sorted(root.rglob("*.py")):
    parts = path.relative_to(root.parent).with_suffix("").parts
    if parts[-1] == "__main__":
        continue
    name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    try:
        importlib.import_module(name)
        print(name)
    except Exception as error:
        failed.append(f"{name}: {error!r}")
sys.exit("\\n".join(failed) or None)
"""
