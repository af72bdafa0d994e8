"""vllm-mlx with our prefix cache (`stable-prefix serve`, engine_patch/): `up`'s default server.

Its lanes are kept by the patched engine itself (engine_patch/cache/: a lane's KV held in RAM and on disk), so it needs
no flag for them; `--engine`, `--draft` and `--cache-bytes` are its own (`up` refuses them for another server).
"""

from __future__ import annotations

from stable_prefix.model_servers.server import ModelServer
from stable_prefix.servers import LOOPBACK, VENV_BIN


def engine_command(options, port: int) -> list[str]:
    command = [str(VENV_BIN / "python"), "-m", "stable_prefix.engine_patch", "serve", options.model,
               "--host", LOOPBACK, "--port", str(port), "--served-model-name", options.model_name,
               "--max-tokens", str(options.max_tokens), "--engine", options.engine, "--draft", options.draft]
    if options.cache_bytes:
        command += ["--prefix-cache-bytes", str(options.cache_bytes)]
    return command + list(options.engine_args)


SERVER = ModelServer(
    name="vllm-mlx",
    what="the patched vllm-mlx engine",
    command=engine_command,
    ready_path="/v1/models",
    reserved_flags=("--host", "--port", "--served-model-name", "--max-tokens", "--prefix-cache-bytes", "--engine", "--continuous-batching", "--draft"),
)
