"""What a pinned third-party package is (`Pin`: which registry serves it, the version run in `make test`, and why that
one), and the pins that belong to no coding agent: the engine's and the routers'.

An agent's pin is its own record's (`CodingAgent.pin`, defined in its module under `stable_prefix/agents/`, listed in
`roster.py`): adding an agent adds no row here. `stable-prefix doctor` (`stable_prefix/doctor.py`) sets the roster's
pins and the routers' against the registry's newest. The engine's versions are the engine patch's own
(`ENGINE_PINS`: what `engine_patch/install.py` accepts, what pyproject's `engine` extra and the Makefile install); a
test checks that they agree.
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
