"""A throwaway git repository for an agent run: its own identity, none of the caller's git config."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ScratchRepository:
    workdir: Path
    home: Path  # git's HOME: no global config of the caller's is read

    def git(self, *arguments: str) -> str:
        environment = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.home), "GIT_CONFIG_NOSYSTEM": "1",
                       "GIT_AUTHOR_NAME": "Sandbox", "GIT_AUTHOR_EMAIL": "sandbox@example.invalid",
                       "GIT_COMMITTER_NAME": "Sandbox", "GIT_COMMITTER_EMAIL": "sandbox@example.invalid"}
        completed = subprocess.run(["git", *arguments], cwd=self.workdir, env=environment, capture_output=True, text=True, timeout=60)
        if completed.returncode != 0:
            raise RuntimeError(f"git {' '.join(arguments)} in {self.workdir} failed: {completed.stderr.strip()}")
        return completed.stdout

    def commit(self, path: str, text: str, message: str) -> None:
        """Write a file and commit it (a change the next conversation's git status shows)."""
        (self.workdir / path).write_text(text)
        self.git("add", path)
        self.git("commit", "--quiet", "-m", message)

    def start(self) -> None:
        """`git init` and a first commit, as a user's project has."""
        self.git("init", "--quiet", "--initial-branch=main")
        self.commit("README.md", "A small project.\n", "Start the project")
