"""What `stable-prefix up --server NAME` needs to know of one model server: a record, one per server module.

A server module (`vllm_mlx.py`, `llama_cpp.py`, ...) holds everything that is that server's own: how it is started for a
model on a port, how it says it is ready, the settings that keep an agent's lanes warm in it (each with why), and what
the proxy turns on before it. `__init__.SERVERS` lists them; the launcher (`stack.py`) reads only the record.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the launcher's options; the record is read by the launcher, never the other way round
    from stable_prefix.stack import StackOptions


@dataclass(frozen=True)
class LaneSetting:
    """A server flag (or a few that go together) that keeps lanes warm, and why, in a line the docs and `up` print."""

    flags: str
    why: str


@dataclass(frozen=True)
class ModelServer:
    name: str  # `up --server NAME`
    what: str  # a few words for `up`'s ready message, e.g. "llama.cpp's llama-server"
    # The command line that serves `options.model` on 127.0.0.1:port, the user's flags after `--` last.
    command: Callable[[StackOptions, int], list[str]]
    ready_path: str  # GET answers below 500 once the model is loaded (and not before)
    lane_settings: tuple[LaneSetting, ...] = ()
    # Flags `up` sets itself (the user's `--` flags must not repeat them: a second value would move the server off
    # loopback or off its port, or undo a lane setting).
    reserved_flags: tuple[str, ...] = ("--host", "--port")
    # Proxy options (`--set NAME=VALUE`) the proxy needs before this server, e.g. llama.cpp's slot lanes.
    proxy_settings: Callable[[StackOptions], dict[str, object]] = field(default=lambda options: {})
    # A clear error for a model argument this server cannot load (None: fine), checked before anything starts.
    check_model: Callable[[str], str | None] = field(default=lambda model: None)
