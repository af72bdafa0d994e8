"""What ships never imports what measures: no module under stable_prefix/, addons/, engine_patch/ or captures/ imports
bench/ or tools/ (the benchmarks, the tiny-model builders), read from the source, nothing imported."""

import pytest

from tests.support.imports import PACKAGE_DIRS, imported_modules, within
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
