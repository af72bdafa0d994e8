"""A prefix KV cache for vllm-mlx's SimpleEngine, installed at start-up.

`python -m stable_prefix.engine_patch serve MODEL [vllm-mlx serve flags]` installs it and
runs vllm-mlx's own CLI; `install()` is the same thing for embedding.
"""

from .install import install
from .prefix_cache import PrefixCache

__all__ = ["install", "PrefixCache"]
