"""A prefix KV cache for vllm-mlx, installed at start-up into its continuous-batching engine (the default) or SimpleEngine.

The rooms, each importing only the ones listed before it:
  cache/     the prefix KV cache that knows no engine
  disk/      the disk tier under the RAM cache
  http_api/  what an HTTP client sees: admission, usage fields, the stats endpoints
  vllm_mlx/  the attachments to vllm-mlx, one folder per engine (batched/, simple/)
  here       install.py (attaches them), __main__.py (serve, and warm from captures/); defaults.py (the modes and defaults
             the CLI offers, importing nothing heavy)
(tests/engine_patch/test_engine_patch_layers.py holds them to it.)

`python -m stable_prefix.engine_patch serve MODEL [vllm-mlx serve flags]` installs it and
runs vllm-mlx's own CLI; `install.install()` is the same thing for embedding.

Importing this package imports nothing else: `defaults.py` (the engine modes and sizes the CLI offers) must load in a
proxy-only install, without mlx-lm, numpy or psutil (the engine is the `[engine]` extra).
"""
