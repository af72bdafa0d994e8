"""stable-prefix: warm turns for Claude Code on a self-hosted model.

One distribution namespace over the repository's top-level folders, so that
nothing generic (`addons`, `tools`, ...) lands in a user's site-packages:

  stable_prefix.addons        request -> normalize, prompt order, lanes, diagnosis; the mitmproxy scripts
  stable_prefix.engine_patch  the engine's prefix KV cache and its seams into vllm-mlx
  stable_prefix.captures      the diff/report CLI over captured requests
  stable_prefix.bench         session generator, replay, metrics, benchmark and demo
  stable_prefix.tools         tiny model builder, Claude Code driver, server harness

`pyproject.toml` maps each name to its folder (`package-dir`).
"""
