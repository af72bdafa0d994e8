"""The Claude Agent SDK (`@anthropic-ai/claude-agent-sdk`, pinned) from npm, driving the pinned Claude Code
through our proxy.

Installed into `.claude-cli/agent-sdk/` (`stable_prefix/agents/npm_package.py`) without its
optional dependencies: those are its own copy of Claude Code (a ~400 MB platform
package), and the script points the SDK at the pinned Claude Code instead
(`pathToClaudeCodeExecutable`), the release the rules are tested with. Its peer
dependencies (`@anthropic-ai/sdk`, the MCP SDK, zod) come with it.

    python -m stable_prefix.agents.claude_agent_sdk install

`AgentSdk.run_turns()` runs `claude_agent_sdk_turns.mjs` (ours) with node: one
`query()` per prompt, the first starting a session and each later one resuming
it (`resume`), in a Claude Code sandbox (HOME, config
folder, project: `claude_code.create_sandbox`) with the environment `claude_code.ClaudeCode` gives the CLI.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from stable_prefix.agents import npm_package
from stable_prefix.agents.base import ANTHROPIC, CodingAgent
from stable_prefix.agents.claude_code import ClaudeCode
from stable_prefix.agents.npm_package import AgentUnavailable
from stable_prefix.pins import Pin

# Its package and pinned version (`stable-prefix doctor` sets it against npm's newest).
PIN = Pin("Claude Agent SDK", "npm", "@anthropic-ai/claude-agent-sdk", "0.3.335",
          "drives the pinned Claude Code binary (pathToClaudeCodeExecutable)")
PACKAGE = PIN.package
VERSION = PIN.version
DEFAULT_DIR = npm_package.INSTALL_ROOT / "agent-sdk"
TURNS_SCRIPT = Path(__file__).with_name("claude_agent_sdk_turns.mjs")


def find_entry(sdk_dir: Path = DEFAULT_DIR) -> Path | None:
    """The SDK's ES module entry, `sdk.mjs`, or None."""
    entry = sdk_dir / "node_modules" / PACKAGE / "sdk.mjs"
    return entry if entry.is_file() else None


def install(sdk_dir: Path = DEFAULT_DIR, version: str = VERSION) -> Path:
    """Install the pinned SDK into `sdk_dir` unless it is there; return its `sdk.mjs`."""
    if shutil.which("node") is None:
        raise AgentUnavailable("node not found on PATH; the Claude Agent SDK needs it")
    return npm_package.install_binary(sdk_dir, PACKAGE, version, find_entry, "its sdk.mjs", npm_options=("--omit=optional",))


@dataclass(frozen=True)
class AgentSdk:
    """A script of ours using the pinned SDK, which drives `claude` (the pinned CLI, in its sandbox)."""

    entry: Path
    claude: ClaudeCode

    def run_turns(self, prompts: list[str], timeout: float = 900.0) -> list[dict]:
        """One `query()` per prompt, each resuming the session the first started; each turn's result line."""
        node = shutil.which("node")
        if node is None:
            raise AgentUnavailable("node not found on PATH")
        command = [node, str(TURNS_SCRIPT), str(self.entry), str(self.claude.binary), str(self.claude.sandbox.workdir), *prompts]
        completed = subprocess.run(command, cwd=self.claude.sandbox.workdir, env=self.claude.environment(), capture_output=True,
                                   text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if completed.returncode != 0:
            raise RuntimeError(f"the Agent SDK script failed (exit status {completed.returncode}):\n{completed.stdout}\n{completed.stderr[-4000:]}")
        return [json.loads(line) for line in completed.stdout.splitlines() if line.startswith("{")]


# A program of the user's own calls `query()`, with the environment `stable-prefix claude` sets as `options.env`; the
# requests are Claude Code's.
AGENT = CodingAgent("agent-sdk", PIN, ANTHROPIC, install, fixture="agent_sdk_entry",
                    launched_by="a program calling `query()`, with the environment `stable-prefix claude` sets as `options.env`")


def main() -> None:
    npm_package.install_command(__doc__.splitlines()[0], install, DEFAULT_DIR, PACKAGE)


if __name__ == "__main__":
    main()
