"""Packaging: one distribution namespace, a console script, and a non-editable install that works."""

import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.support.processes import REPO_ROOT


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPO_ROOT), "--no-deps", "--quiet", "-w", str(out)],
                   check=True, capture_output=True, timeout=600)
    [built] = out.glob("stable_prefix-*.whl")
    return built


def test_the_wheel_installs_nothing_but_the_stable_prefix_namespace(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert top_level == {"stable_prefix"}, "a generic top-level name (addons, tools, ...) could collide in site-packages"
    for script in ("addons/strip_billing.py", "addons/capture.py", "addons/exposure.py", "agents/claude_code_router.py",
                   "agents/claude_agent_sdk_turns.mjs"):
        assert f"stable_prefix/{script}" in names
    assert "stable_prefix/engine_patch/vllm_mlx/batched/batched_engine.py" in names, "a sub-package of engine_patch/ is missing from the wheel"


def test_every_folder_of_the_namespace_with_an_init_is_a_listed_package():
    # setuptools installs only the packages pyproject lists: a new sub-folder left out works editable and breaks a wheel.
    setuptools = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    present = set()
    for name, folder in setuptools["package-dir"].items():
        for init in (REPO_ROOT / folder).rglob("__init__.py"):
            present.add(".".join((name, *init.parent.relative_to(REPO_ROOT / folder).parts)))
    assert present - listed == set(), f"folders with __init__.py not in [tool.setuptools] packages: {sorted(present - listed)}"


def test_the_wheel_declares_the_console_script(wheel):
    archive = zipfile.ZipFile(wheel)
    [entry_points] = [name for name in archive.namelist() if name.endswith(".dist-info/entry_points.txt")]
    assert "stable-prefix = stable_prefix.cli:main" in archive.read(entry_points).decode()


def test_a_non_editable_install_runs_from_its_own_site_packages(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--no-deps", str(wheel)], check=True, capture_output=True, timeout=300)
    # The dependencies come from this venv (no second download); the package itself only from the wheel.
    site_packages = Path(subprocess.check_output([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                                 text=True).strip())
    (site_packages / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    result = subprocess.run([str(venv / "bin" / "stable-prefix"), "--help"], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert result.returncode == 0 and "up " in result.stdout and "claude " in result.stdout
    where = subprocess.check_output([str(venv / "bin" / "python"), "-c",
                                     "import stable_prefix.addons.capture as c, stable_prefix.servers as s; print(c.__file__); print(s.REPO_ROOT)"],
                                    text=True, cwd=tmp_path).split()
    assert all(path.startswith(str(site_packages)) for path in where), where
    assert (Path(where[1]) / "addons" / "strip_billing.py").is_file(), "the launcher finds the mitmproxy scripts in the install"
