"""What ships never imports what measures: no module under stable_prefix/, addons/, engine_patch/ or captures/ imports
bench/ or tools/ (the benchmarks, the tiny-model builders), read from the source, nothing imported."""

import subprocess
import sys

import pytest

from tests.support.imports import PACKAGE_DIRS, imported_modules, package_of, within
from tests.support.processes import REPO_ROOT

SHIPPED = ("stable_prefix", "stable_prefix.addons", "stable_prefix.engine_patch", "stable_prefix.captures")
DEVELOPMENT = ("stable_prefix.bench", "stable_prefix.tools")
MODULES = sorted(path for package in SHIPPED for path in PACKAGE_DIRS[package].rglob("*.py"))


def development_imports(path, source=None) -> list[str]:
    names = imported_modules(path, source)
    return sorted(name for package in DEVELOPMENT for name in within(names, package))


def test_every_shipped_folder_is_read():
    read = {path.relative_to(REPO_ROOT).parts[0] for path in MODULES}
    assert read == {"stable_prefix", "addons", "engine_patch", "captures"}
    assert not any(path.is_relative_to(PACKAGE_DIRS[package]) for path in MODULES for package in DEVELOPMENT)


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(REPO_ROOT)))
def test_a_shipped_module_imports_nothing_from_bench_or_tools(path):
    found = development_imports(path)
    assert not found, f"{path.relative_to(REPO_ROOT)} ships, and imports what only development has: {found}"


def test_the_reader_catches_a_development_import_written_any_way():
    # The rule has teeth: absolute, `from package import module`, inside a function, and relative from a sub-package.
    live = REPO_ROOT / "stable_prefix" / "live.py"
    source = live.read_text() + ("\nfrom stable_prefix.bench.clients.replay import Replayer\nfrom stable_prefix import tools\n"
                                 "def later():\n    import stable_prefix.bench.run\n")
    assert development_imports(live, source) == ["stable_prefix.bench.clients.replay.Replayer", "stable_prefix.bench.run", "stable_prefix.tools"]
    agent = REPO_ROOT / "stable_prefix" / "agents" / "pi.py"
    assert development_imports(agent, "from ..tools import build_tiny_model\n") == ["stable_prefix.tools.build_tiny_model"]


# What only the engine (`pip install .[engine]`) brings: a proxy-only install has none of it.
ENGINE_ONLY = ("numpy", "psutil", "mlx", "mlx_lm", "vllm_mlx", "transformers", "torch")
PROXY_PATH = ("stable_prefix", "stable_prefix.addons", "stable_prefix.captures")
# Imports every module of the proxy's path with the engine's dependencies refused, as in a proxy-only install (the
# clean venv of test_proxy_only_install.py is the whole check; this is its fast loop). Prints what failed.
IMPORT_WITHOUT_THE_ENGINE = """
import importlib, importlib.abc, sys
class Refused(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {engine_only!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (refused: the engine's)", name=name)
sys.meta_path.insert(0, Refused())
failed = []
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception as error:
        failed.append(f"{{name}}: {{error!r}}")
sys.exit("\\n".join(failed) or None)
"""


def module_name(path) -> str:
    return package_of(path) + ("" if path.stem == "__init__" else f".{path.stem}")


def test_the_proxy_the_cli_and_the_engine_defaults_import_without_the_engines_dependencies():
    modules = sorted({module_name(path) for package in PROXY_PATH for path in PACKAGE_DIRS[package].rglob("*.py") if path.stem != "__main__"})
    modules += ["stable_prefix.engine_patch", "stable_prefix.engine_patch.defaults"]
    result = subprocess.run([sys.executable, "-c", IMPORT_WITHOUT_THE_ENGINE.format(engine_only=ENGINE_ONLY), *modules],
                            capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    assert result.returncode == 0, f"modules a proxy-only install cannot import:\n{result.stderr}"
    assert "stable_prefix.stack" in modules and "stable_prefix.addons.strip_billing" in modules
