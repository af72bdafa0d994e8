"""Every third-party client the project pins, in one table: which registry serves it, the version run
in `make test`, and why that one.

The installers (`claude_code.py`, `claude_code_router.py`, `opencode.py`,
`qwen_code.py`, `codex_cli.py`, `pi.py`, `claude_agent_sdk.py`) take their
package and version from here; `stable-prefix doctor` (`stable_prefix/doctor.py`)
sets each against the registry's newest. The engine's versions are the engine
patch's own (`ENGINE_PINS`: what `engine_patch/install.py` accepts, what
pyproject's `engine` extra and the Makefile install); a test checks that they agree.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Pin:
    name: str  # as the docs call it
    registry: str  # "npm" or "pypi"
    package: str
    version: str  # the version `make test` installs and runs
    note: str = ""  # why this version, when it is not simply the newest we ran


CLAUDE_CODE = Pin("Claude Code", "npm", "@anthropic-ai/claude-code", "2.1.332")
CLAUDE_CODE_ROUTER = Pin("claude-code-router", "npm", "@musistudio/claude-code-router", "2.0.0",
                         "3.x cannot be installed here: its dependencies @the-next-ai/ai-gateway and "
                         "@the-next-ai/bot-gateway-sdk are not on the registry (404); 3.x is documented in docs/launcher.md")
OPENCODE = Pin("opencode", "npm", "opencode-ai", "1.18.33")
QWEN_CODE = Pin("Qwen Code", "npm", "@qwen-code/qwen-code", "0.24.4")
CODEX_CLI = Pin("Codex CLI", "npm", "@openai/codex", "0.171.0")
PI = Pin("Pi", "npm", "@mariozechner/pi-coding-agent", "0.73.1")
CLAUDE_AGENT_SDK = Pin("Claude Agent SDK", "npm", "@anthropic-ai/claude-agent-sdk", "0.3.333",
                       "drives the pinned Claude Code binary (pathToClaudeCodeExecutable)")
AGENT_PINS = (CLAUDE_CODE, CLAUDE_CODE_ROUTER, OPENCODE, QWEN_CODE, CODEX_CLI, PI, CLAUDE_AGENT_SDK)

# The engine `make test` installs and runs the patch against (the Makefile, requirements.txt and pyproject's
# `engine` extra install these); which vllm-mlx releases the patch accepts is engine_patch/install.py's
# TESTED_VERSIONS (0.3.0 and 0.6.0, the ones run).
VLLM_MLX = Pin("vllm-mlx", "pypi", "vllm-mlx", "0.6.0", "0.6.0 runs the whole suite, 0.3.0 a warm hit (tests/engine_patch/test_install.py)")
MLX_LM = Pin("mlx-lm", "pypi", "mlx-lm", "0.31.3",
             "0.31.x runs the whole suite; 0.32.2 runs the snapshot/restore core only (tests/engine_patch/cache/test_cache_layers.py)")
ENGINE_PINS = (VLLM_MLX, MLX_LM)

# Routers a team puts in front of several engines (stable_prefix/routers.py installs and starts them; the Makefile's
# `routers` target installs these versions, each in a venv of its own). HAProxy comes from the system's
# packages (Debian's, Homebrew's), so no version of it is pinned.
SMG = Pin("smg", "pypi", "smg", "1.13.0", "SGLang's model gateway; Linux and macOS arm64 wheels")
VLLM_ROUTER = Pin("vllm-router", "pypi", "vllm-router", "0.1.17", "Linux wheels only")
ROUTER_PINS = (SMG, VLLM_ROUTER)
