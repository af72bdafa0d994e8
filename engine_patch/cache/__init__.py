"""The prefix KV cache that knows no engine: entries and lanes, what one request restores, checkpoints and stores.

Imports mlx and mlx-lm only: never the disk tier, the HTTP side, vllm-mlx or an engine attachment.
"""
