"""How the suite is laid out (docs/testing.md): test files mirror the source tree and share helpers only through
tests/support, so a test file can be moved, split or deleted without breaking another."""

import ast
from pathlib import Path

TESTS = Path(__file__).parent


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_no_test_file_imports_another_test_file():
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        for name in imported_modules(path):
            if name.startswith("tests.") and name.rsplit(".", 1)[-1].startswith("test_"):
                offenders.append(f"{path.relative_to(TESTS.parent)} imports {name}")
    assert offenders == [], "move what they share into tests/support:\n" + "\n".join(offenders)


def test_every_test_folder_mirrors_a_source_folder_or_module():
    root = TESTS.parent
    own = {"support", "fixtures", "e2e", "__pycache__"}  # the suite's own: helpers, bodies, whole-stack runs
    strays = []
    for folder in sorted(p for p in TESTS.rglob("*") if p.is_dir()):
        relative = folder.relative_to(TESTS)
        if relative.parts[0] in own or "__pycache__" in relative.parts:
            continue
        if not (root / relative).is_dir() and not (root / relative).with_suffix(".py").is_file():
            strays.append(str(relative))
    assert strays == [], f"test folders with no source folder or module of that name: {strays}"
