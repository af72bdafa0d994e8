"""claude-code-router (`ccr`), pinned, pointed at our proxy's `/v1/chat/completions`, run offline.

The router translates Claude Code's Anthropic requests into OpenAI chat
completions for a provider. Installed from npm into its own folder beside the
Claude Code CLI (`.claude-cli/router/`: one `npm install --no-save` per prefix,
since a second one into the same prefix would prune the first), never into the
user's global npm prefix. 2.0.0 is pinned: 3.x does not install here (one of its
dependencies is not served by the registry).

What a run needs to stay on this machine and leave the user's set-up alone:
HOME (the router reads `~/.claude-code-router/config.json` and writes its PID
file and logs there) and TMPDIR (its reference count of running `ccr code`
sessions) point into a sandbox. `ccr code` starts the router service detached
when none runs, and stops it when its Claude Code exits and no other `ccr
code` holds it; `stop_service()` makes sure of that.

    python -m stable_prefix.agents.claude_code_router install
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from stable_prefix.agents import npm_package
from stable_prefix.agents.base import OPENAI_CHAT, REQUEST_TIMEOUT_MS, CodingAgent
from stable_prefix.agents.claude_code import ClaudeCodeUnavailable
from stable_prefix.pins import Pin

# Its package and pinned version (`stable-prefix doctor` sets it against npm's newest).
PIN = Pin("claude-code-router", "npm", "@musistudio/claude-code-router", "2.0.0",
          "3.x cannot be installed here: its dependencies @the-next-ai/ai-gateway and "
          "@the-next-ai/bot-gateway-sdk are not on the registry (404); 3.x is documented in docs/launcher.md")
ROUTER_PACKAGE = PIN.package
ROUTER_VERSION = PIN.version
DEFAULT_ROUTER_DIR = npm_package.INSTALL_ROOT / "router"
PROVIDER_NAME = "stable-prefix"
DEFAULT_ROUTER_PORT = 3456
# Any value: the engine checks no key. The router sends it as `Authorization: Bearer`.
PROVIDER_API_KEY = "local-model"


def router_config(proxy_url: str, model: str, *, port: int = DEFAULT_ROUTER_PORT) -> dict:
    """`~/.claude-code-router/config.json` for a stack whose proxy is at `proxy_url`.

    HOST is explicit and APIKEY absent on purpose: ccr 2.0.0 listens on 127.0.0.1
    only while no APIKEY is set; with one and no HOST it listens on every interface.
    Every route (default, background, think, long context) goes to the one model.
    """
    route = f"{PROVIDER_NAME},{model}"
    return {
        "HOST": "127.0.0.1",
        "PORT": port,
        "LOG": False,
        "API_TIMEOUT_MS": REQUEST_TIMEOUT_MS,
        "Providers": [{"name": PROVIDER_NAME, "api_base_url": f"{proxy_url}/v1/chat/completions",
                       "api_key": PROVIDER_API_KEY, "models": [model]}],
        "Router": {"default": route, "background": route, "think": route, "longContext": route},
    }


def find_router(router_dir: Path = DEFAULT_ROUTER_DIR) -> Path | None:
    cli = router_dir / "node_modules" / ROUTER_PACKAGE / "dist" / "cli.js"
    return cli if cli.is_file() else None


def install(router_dir: Path = DEFAULT_ROUTER_DIR, version: str = ROUTER_VERSION) -> Path:
    """Install the pinned router into `router_dir` unless it is there; return its `cli.js`."""
    return npm_package.install_binary(router_dir, ROUTER_PACKAGE, version, find_router, "its dist/cli.js", ClaudeCodeUnavailable)


@dataclass(frozen=True)
class Router:
    """The pinned router, its config in a sandbox HOME, launching the given Claude Code binary."""

    cli: Path
    home: Path
    claude_config_dir: Path
    workdir: Path
    claude_binary: Path
    # Passed on to Claude Code: ccr starts it with its own environment plus a few variables of its own.
    claude_environment: dict[str, str] = field(default_factory=dict)

    @classmethod
    def create(cls, cli: Path, sandbox_root: Path, *, claude_config_dir: Path, workdir: Path, claude_binary: Path,
               proxy_url: str, model: str, port: int, claude_environment: dict[str, str] | None = None) -> Router:
        router = cls(cli, sandbox_root / "router-home", claude_config_dir, workdir, claude_binary, claude_environment or {})
        (router.home / ".claude-code-router").mkdir(parents=True, exist_ok=True)
        router.tmpdir.mkdir(parents=True, exist_ok=True)
        config = {**router_config(proxy_url, model, port=port),
                  # Print mode: no terminal UI; the router hands claude a pipe for stdin.
                  "NON_INTERACTIVE_MODE": True,
                  "CLAUDE_PATH": str(claude_binary)}
        router.config_path.write_text(json.dumps(config, indent=2))
        return router

    @property
    def tmpdir(self) -> Path:
        return self.home / "tmp"

    @property
    def config_path(self) -> Path:
        return self.home / ".claude-code-router" / "config.json"

    @property
    def pid_file(self) -> Path:
        return self.home / ".claude-code-router" / ".claude-code-router.pid"

    def environment(self) -> dict[str, str]:
        """Nothing of the caller's shell leaks in; Claude Code's own variables come from the router's --settings."""
        return {
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": str(self.home),
            "TMPDIR": str(self.tmpdir),
            "LANG": "C.UTF-8",
            "CLAUDE_CONFIG_DIR": str(self.claude_config_dir),
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "CLAUDE_CODE_MAX_RETRIES": "0",
            **self.claude_environment,
        }

    def code(self, prompt: str, *, continue_conversation: bool = False, timeout: float = 900.0) -> subprocess.CompletedProcess[str]:
        """`ccr code -p PROMPT` (after `--continue` for a later turn): the router passes the flags on to claude."""
        node = shutil.which("node")
        if node is None:
            raise ClaudeCodeUnavailable("node not found on PATH; claude-code-router needs it")
        # ccr re-parses its arguments (minimist) and rebuilds a shell command line: a
        # flag without a value must come before one with a value.
        arguments = (["--continue"] if continue_conversation else []) + ["-p", prompt]
        try:
            return subprocess.run([node, str(self.cli), "code", *arguments], cwd=self.workdir, env=self.environment(),
                                  capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                                  start_new_session=True)
        finally:
            self.stop_service()

    def service_pid(self) -> int | None:
        try:
            return int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None

    def stop_service(self, grace: float = 10.0) -> None:
        """Stop the detached router service if `ccr code` left it running (it does when claude was killed)."""
        pid = self.service_pid()
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                os.kill(pid, 0)  # ProcessLookupError once it is gone
                time.sleep(0.2)
            os.kill(pid, signal.SIGKILL)
        self.pid_file.unlink(missing_ok=True)


# Claude Code speaks Anthropic to it, it speaks OpenAI chat completions to the stack, Claude Code's requests translated
# (the proxy's lanes read them as Claude Code's). The user runs `ccr code` with the config `stable-prefix up` prints.
AGENT = CodingAgent("ccr", PIN, OPENAI_CHAT, install, fixture="router_cli",
                    launched_by="`ccr code`, with the ~/.claude-code-router/config.json `stable-prefix up` prints")


def main() -> None:
    npm_package.install_command(__doc__.splitlines()[0], install, DEFAULT_ROUTER_DIR, ROUTER_PACKAGE)


if __name__ == "__main__":
    main()
