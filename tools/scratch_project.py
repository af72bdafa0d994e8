"""A throwaway HOME and project folder for one agent run, the project a git repository if asked.

git runs with an identity of its own and none of the caller's configuration,
so the commits (and the git status an agent reads) are the same on every machine.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path


def git(workdir: Path, home: Path, *arguments: str) -> str:
    environment = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1",
                   "GIT_AUTHOR_NAME": "Sandbox", "GIT_AUTHOR_EMAIL": "sandbox@example.invalid",
                   "GIT_COMMITTER_NAME": "Sandbox", "GIT_COMMITTER_EMAIL": "sandbox@example.invalid"}
    completed = subprocess.run(["git", *arguments], cwd=workdir, env=environment, capture_output=True, text=True, timeout=60)
    if completed.returncode != 0:
        raise RuntimeError(f"git {' '.join(arguments)} in {workdir} failed: {completed.stderr.strip()}")
    return completed.stdout


def commit(workdir: Path, home: Path, path: str, text: str, message: str) -> None:
    """Write a file and commit it (a change the next conversation's git status shows)."""
    (workdir / path).write_text(text)
    git(workdir, home, "add", path)
    git(workdir, home, "commit", "--quiet", "-m", message)


@dataclass(frozen=True)
class ScratchProject:
    home: Path
    workdir: Path

    @classmethod
    def create(cls, root: Path, *, git_repository: bool = True) -> ScratchProject:
        """`git_repository`: the project is a git repository with one commit, as a user's is."""
        project = cls(home=root / "home", workdir=root / "project")
        for folder in (project.home, project.workdir):
            folder.mkdir(parents=True, exist_ok=True)
        if git_repository:
            project.git("init", "--quiet", "--initial-branch=main")
            project.commit("README.md", "A small project.\n", "Start the project")
        return project

    def git(self, *arguments: str) -> str:
        return git(self.workdir, self.home, *arguments)

    def commit(self, path: str, text: str, message: str) -> None:
        commit(self.workdir, self.home, path, text, message)
