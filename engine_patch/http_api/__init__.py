"""What an HTTP client sees of the cache: a request's admission or refusal, reuse in `usage`, the stats and clear endpoints.

Imports the cache core and the disk tier; never an engine attachment (vllm_mlx/ imports this, not the other way).
"""
