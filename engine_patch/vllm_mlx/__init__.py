"""The attachments to vllm-mlx 0.6.0: one folder per engine (simple/, batched/), the seams shared by both beside them.

Imports every room below (cache, disk, http_api); a new engine or server (mlx_lm.server, Rapid-MLX) gets a sibling folder.
"""
