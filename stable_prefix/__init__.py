"""stable-prefix: warm turns for coding agents on a self-hosted model.

One distribution namespace over the repository's top-level folders, so that
nothing generic (`addons`, `tools`, ...) lands in a user's site-packages:

  stable_prefix               the `stable-prefix` command (cli.py) and what it runs: the stack, routers, servers, pins
  stable_prefix.agents        one module per coding agent: its pin, install, environment and driver
  stable_prefix.addons        request -> normalize, prompt order, lanes, diagnosis; the mitmproxy scripts
  stable_prefix.engine_patch  the engine's prefix KV cache and its seams into vllm-mlx
  stable_prefix.captures      the diff/report CLI over captured requests
  stable_prefix.bench         the benchmarks and the demo (development: nothing above imports it)
  stable_prefix.tools         tiny and real-weights model builders (development: nothing above imports it)

`pyproject.toml` maps each name to its folder (`package-dir`).
"""
