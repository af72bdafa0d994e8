"""Where `stable-prefix up` records the stack it runs (its URL, model, output cap), for the agent launchers to find.

One file per proxy port, under `$XDG_STATE_HOME/stable-prefix/` (`~/.local/state/stable-prefix/`).
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_PORT = 8080


def stack_state_path(port: int) -> Path:
    state_home = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return state_home / "stable-prefix" / f"stack-{port}.json"
