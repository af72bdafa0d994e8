"""Packaging: one distribution namespace, a console script, and a non-editable install that works."""

import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

from tests.support.processes import REPO_ROOT
from tests.support.wheel import IMPORT_EVERY_MODULE


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


def test_the_wheel_requires_only_the_proxys_dependencies_and_offers_the_engine_as_an_extra(wheel):
    archive = zipfile.ZipFile(wheel)
    [metadata] = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
    requires = [line.removeprefix("Requires-Dist: ") for line in archive.read(metadata).decode().splitlines() if line.startswith("Requires-Dist: ")]
    plain = {re.match(r"[\w.-]+", requirement).group() for requirement in requires if "extra ==" not in requirement}
    engine = {re.match(r"[\w.-]+", requirement).group() for requirement in requires if 'extra == "engine"' in requirement}
    assert plain == {"mitmproxy", "deepdiff"}, "a proxy-only install (pip install stable-prefix) must not need the engine's packages"
    assert {"mlx-lm", "vllm-mlx", "numpy", "psutil"} <= engine


def test_the_wheel_declares_the_console_script(wheel):
    archive = zipfile.ZipFile(wheel)
    [entry_points] = [name for name in archive.namelist() if name.endswith(".dist-info/entry_points.txt")]
    assert "stable-prefix = stable_prefix.cli:main" in archive.read(entry_points).decode()


def installed(wheel: Path, venv: Path) -> Path:
    """A fresh venv with the wheel installed; the dependencies come from this venv (no second download), the
    package itself only from the wheel. Returns its site-packages."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--no-deps", str(wheel)], check=True, capture_output=True, timeout=300)
    site_packages = Path(subprocess.check_output([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                                 text=True).strip())
    (site_packages / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return site_packages


def test_a_non_editable_install_runs_from_its_own_site_packages(wheel, tmp_path):
    venv = tmp_path / "venv"
    site_packages = installed(wheel, venv)
    result = subprocess.run([str(venv / "bin" / "stable-prefix"), "--help"], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert result.returncode == 0 and "up " in result.stdout and "claude " in result.stdout
    where = subprocess.check_output([str(venv / "bin" / "python"), "-c",
                                     "import stable_prefix.addons.capture as c, stable_prefix.servers as s; print(c.__file__); print(s.REPO_ROOT)"],
                                    text=True, cwd=tmp_path).split()
    assert all(path.startswith(str(site_packages)) for path in where), where
    assert (Path(where[1]) / "addons" / "strip_billing.py").is_file(), "the launcher finds the mitmproxy scripts in the install"


def test_the_installed_package_runs_without_bench_and_tools(wheel, tmp_path):
    # What ships works with what measures gone: the wheel still carries bench/ and tools/, a user needs neither.
    venv = tmp_path / "venv"
    site_packages = installed(wheel, venv)
    for development in ("bench", "tools"):
        shutil.rmtree(site_packages / "stable_prefix" / development)
    python = str(venv / "bin" / "python")
    gone = subprocess.run([python, "-c", "import stable_prefix.bench"], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert gone.returncode != 0 and "No module named 'stable_prefix.bench'" in gone.stderr

    up = subprocess.run([str(venv / "bin" / "stable-prefix"), "up", "--help"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert up.returncode == 0 and "usage: stable-prefix up" in up.stdout, up.stderr
    imports = subprocess.run([python, "-c", IMPORT_EVERY_MODULE], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert imports.returncode == 0, f"shipped modules that do not import without bench/ and tools/:\n{imports.stderr}"
    imported = set(imports.stdout.split())
    assert {"stable_prefix.stack", "stable_prefix.agents.claude_code", "stable_prefix.addons.strip_billing", "stable_prefix.captures.cli",
            "stable_prefix.engine_patch.vllm_mlx.batched.batched_engine"} <= imported, sorted(imported)
