"""The disk tier under the RAM cache: snapshot files, their directory and budget, the model's identity, RAM over disk.

Imports the cache core below it; never the HTTP side, vllm-mlx or an engine attachment.
"""
