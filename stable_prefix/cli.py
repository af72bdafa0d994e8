"""`stable-prefix COMMAND ...`: the project's one command line.

Each command belongs to the package that owns the idea; this module only
dispatches, so `python -m stable_prefix.<package>` and `stable-prefix` run the
same code.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable

from stable_prefix.agents.roster import AGENTS

# What only the `[engine]` extra installs: a proxy-only install (`pip install stable-prefix`) has none of it.
ENGINE_DEPENDENCIES = ("numpy", "psutil", "mlx", "mlx_lm", "vllm_mlx")


def _engine_patch(command: str) -> Callable[[list[str]], int]:
    def run(argv: list[str]) -> int:
        try:
            from stable_prefix.engine_patch.__main__ import main
        except ModuleNotFoundError as missing:
            if (missing.name or "").split(".")[0] not in ENGINE_DEPENDENCIES:
                raise
            print(f"stable-prefix {command}: the patched engine is not installed here (no {missing.name}): "
                  "pip install 'stable-prefix[engine]' (on a Mac), or run the proxy alone before your server: "
                  "stable-prefix up --upstream URL", file=sys.stderr)
            return 2
        return main([command, *argv])

    return run


def _main_of(module: str) -> Callable[[list[str]], int]:
    """`stable_prefix.<module>.main`, imported when its command runs (each command loads only its own code)."""
    def run(argv: list[str]) -> int:
        return importlib.import_module(f"stable_prefix.{module}").main(argv)

    return run


def _agent_commands() -> dict[str, tuple[str, Callable[[list[str]], int]]]:
    """`stable-prefix <agent>` for every agent whose record has a launcher (`stable_prefix/agents/roster.py`)."""
    return {agent.key: (agent.command_help, agent.launch) for agent in AGENTS if agent.launcher is not None}


def _captures(command: str) -> Callable[[list[str]], int]:
    def run(argv: list[str]) -> int:
        from stable_prefix.captures.cli import main

        return main([command, *argv])

    return run


# command -> (one-line help, runner taking the remaining arguments)
COMMANDS: dict[str, tuple[str, Callable[[list[str]], int]]] = {
    "up": ("engine + proxy on 127.0.0.1 until Ctrl-C: up MODEL [--port 8080] [--engine batched|simple] [--draft auto|on|off] [--web] [--cache-bytes SIZE] "
           "[-- vllm-mlx flags]; llama.cpp's llama-server instead: up --server llama.cpp MODEL.gguf [--slots 4] [--slot-context 32768] "
           "[-- llama-server flags]; "
           "the proxy alone before a router or a remote engine: up --upstream URL --served-model-name NAME", _main_of("stack")),
    "router": ("a router before several engines: router smg|haproxy|vllm-router --replica URL ... [--port 8090] [--policy key|round_robin|prefix] [--print]",
               _main_of("router_command")),
    **_agent_commands(),
    "doctor": ("every pinned client against its registry's newest, and the engine against the tested versions", _main_of("doctor")),
    "serve": ("the patched vllm-mlx server: serve MODEL [--engine batched|simple] [--draft auto|on|off] [--prefix-cache-bytes SIZE] [--prefix-cache-dir DIR] "
              "[vllm-mlx flags]",
              _engine_patch("serve")),
    "warm": ("pre-warm a running server's prefix cache: warm CAPTURE_OR_BODY.json|DIR... --url URL", _main_of("captures.warm")),
    "diff": ("compare two captured requests: diff A.json B.json [--normalized] [--json]", _captures("diff")),
    "report": ("per-lane prefix report of a capture folder: report DIR [--json] [--html FILE]", _captures("report")),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name.ljust(width)}  {help_text}" for name, (help_text, _) in COMMANDS.items()]
    return "usage: stable-prefix COMMAND [ARGS]\n\ncommands:\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    command = COMMANDS.get(argv[0])
    if command is None:
        print(f"stable-prefix: unknown command {argv[0]!r}\n\n{usage()}", file=sys.stderr)
        return 2
    return command[1](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
