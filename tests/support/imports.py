"""What a module imports, read from its source (nothing is imported): the tests that hold the tree's import rules use it.

A file's dotted package comes from pyproject's `package-dir` (addons/ is `stable_prefix.addons`, ...), so relative imports
resolve as Python resolves them in the installed namespace.
"""

import ast
import tomllib
from pathlib import Path

from tests.support.processes import REPO_ROOT

PACKAGE_DIRS = {name: REPO_ROOT / folder
                for name, folder in tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].items()}


def package_of(path: Path) -> str:
    """The dotted package a module file lives in, e.g. stable_prefix.engine_patch.vllm_mlx.simple for a file in
    engine_patch/vllm_mlx/simple/ (the deepest `package-dir` folder holding it, then its sub-folders)."""
    folder = path.resolve().parent
    name, root = max(((name, root) for name, root in PACKAGE_DIRS.items() if folder.is_relative_to(root)), key=lambda item: len(item[1].parts))
    return ".".join((name, *folder.relative_to(root).parts))


def imported_modules(path: Path, source: str | None = None) -> set[str]:
    """Every dotted name a module (its file, or source standing in for it) imports, relative imports resolved, at any
    depth of the file (imports inside functions too); `from package import name` counts as `package.name`."""
    package = package_of(path)
    found = set()
    for node in ast.walk(ast.parse(source if source is not None else path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            # `from package import module` imports that module: count it as itself.
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def within(names: set[str], package: str) -> set[str]:
    """The names that are `package` or inside it."""
    return {name for name in names if name == package or name.startswith(package + ".")}
