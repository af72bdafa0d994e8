"""A throwaway HOME and project folder for an agent run, the project a git repository if asked.

git runs with an identity of its own and none of the caller's configuration
(its HOME is the scratch one, no system config), so the commits, and the git
status an agent reads, are the same on every machine. An agent that keeps its
configuration in a folder of its own (Claude Code's CLAUDE_CONFIG_DIR, Codex's
CODEX_HOME) gets a `Sandbox`: the two and that folder beside them, which its
module fills (`claude_code.create_sandbox`, `codex_cli.create_sandbox`);
opencode, Qwen Code and Pi need none of their own.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ScratchProject:
    home: Path  # the agent's HOME, and git's: no global config of the caller's is read
    workdir: Path

    @classmethod
    def create(cls, root: Path, *, git_repository: bool = True) -> ScratchProject:
        """`root/home` and `root/project`; `git_repository`: the project is a git repository
        with one commit, as a user's is."""
        project = cls(home=root / "home", workdir=root / "project")
        for folder in (project.home, project.workdir):
            folder.mkdir(parents=True, exist_ok=True)
        if git_repository:
            project.git("init", "--quiet", "--initial-branch=main")
            project.commit("README.md", "A small project.\n", "Start the project")
        return project

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


@dataclass(frozen=True)
class Sandbox:
    """A throwaway HOME, the agent's own config folder and a project, for one conversation (or several, continued)."""

    home: Path
    config_dir: Path
    workdir: Path

    @classmethod
    def create(cls, root: Path, config_folder: str, *, git_repository: bool = True) -> Sandbox:
        """`root/home`, `root/<config_folder>` (empty: the agent's module writes its config) and `root/project`."""
        project = ScratchProject.create(root, git_repository=git_repository)
        sandbox = cls(home=project.home, config_dir=root / config_folder, workdir=project.workdir)
        sandbox.config_dir.mkdir(parents=True, exist_ok=True)
        return sandbox

    @property
    def project(self) -> ScratchProject:
        """HOME and working directory (`project.commit(...)`: an edit and a commit between conversations)."""
        return ScratchProject(self.home, self.workdir)
