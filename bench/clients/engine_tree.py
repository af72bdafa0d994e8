"""Another checkout's engine, run beside this one's: the engine before (or after) a change, in the same run.

A checkout with its own venv (`make setup` there: an editable install of that
tree) runs with that venv's interpreter. A tree without one (a `git archive` of
a commit) runs with this venv's interpreter and the same packages, its folders
laid out as the installed namespace (pyproject's `package-dir`: addons/ as
`stable_prefix.addons`, ...) in build/engine-trees/ and put first on
PYTHONPATH, from where it is run, so no module of this checkout is imported.
"""

from __future__ import annotations

import hashlib
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from stable_prefix.servers import REPO_ROOT, VENV_BIN

NAMESPACES = REPO_ROOT / "build" / "engine-trees"


@dataclass(frozen=True)
class EngineTree:
    """Whose engine runs: a checkout, the interpreter that imports it, and how."""

    label: str
    tree: Path
    python: Path
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path = REPO_ROOT

    @property
    def name(self) -> str:
        return self.tree.name

    @property
    def is_this_checkout(self) -> bool:
        return self.tree == REPO_ROOT

    @classmethod
    def of(cls, tree: Path) -> EngineTree:
        tree = tree.resolve()
        if not (tree / "engine_patch").is_dir():
            raise FileNotFoundError(f"{tree}: not a stable-prefix checkout (no engine_patch/)")
        engine = f"engine {engine_digest(tree)}"
        if (tree / ".git").exists():
            label = f"{_git(tree, 'rev-parse', '--abbrev-ref', 'HEAD')} at {_git(tree, 'rev-parse', '--short', 'HEAD')}, {engine}"
        else:
            label = f"{tree.name}, {engine}"
        if tree == REPO_ROOT:
            return cls(label, tree, VENV_BIN / "python")
        python = tree / ".venv" / "bin" / "python"
        if python.exists():
            return cls(label, tree, python, cwd=tree)
        namespace = installed_namespace(tree)
        return cls(f"{label} (this venv)", tree, VENV_BIN / "python", {"PYTHONPATH": str(namespace)}, namespace)


def engine_digest(tree: Path) -> str:
    """Which engine code a tree has: a digest of every file under its engine_patch/ (equal digests, the same engine)."""
    digest = hashlib.sha256()
    for path in sorted((tree / "engine_patch").rglob("*.py")):
        digest.update(str(path.relative_to(tree)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:8]


def this_checkout() -> EngineTree:
    return EngineTree.of(REPO_ROOT)


def installed_namespace(tree: Path) -> Path:
    """A folder where `import stable_prefix.<part>` finds `tree`'s folders, as its pyproject installs them."""
    mapping = tomllib.loads((tree / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    root = NAMESPACES / f"{tree.name}-{hashlib.sha256(str(tree).encode()).hexdigest()[:8]}"
    package = root / "stable_prefix"
    package.mkdir(parents=True, exist_ok=True)
    for path in (tree / mapping["stable_prefix"]).iterdir():
        _link(package / path.name, path)
    for name, folder in mapping.items():
        if name != "stable_prefix":
            _link(package / name.removeprefix("stable_prefix."), tree / folder)
    return root


def _link(link: Path, target: Path) -> None:
    if link.is_symlink() and link.resolve() == target.resolve():
        return
    if link.is_symlink():
        link.unlink()
    link.symlink_to(target)


def _git(tree: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True).stdout.strip() or "unknown"
