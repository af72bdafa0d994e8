"""The model servers `stable-prefix up --server NAME` starts, one module each (its record: `server.ModelServer`).

A new server is a module here with its `SERVER` record, and a line below.
"""

from __future__ import annotations

from stable_prefix.model_servers import llama_cpp, vllm, vllm_mlx
from stable_prefix.model_servers.server import LaneSetting, ModelServer

SERVERS: dict[str, ModelServer] = {server.name: server for server in (vllm_mlx.SERVER, llama_cpp.SERVER, vllm.SERVER)}
DEFAULT_SERVER = vllm_mlx.SERVER.name

__all__ = ["DEFAULT_SERVER", "SERVERS", "LaneSetting", "ModelServer"]
