"""The engine patch: the cache core, its seams into vllm-mlx (both engines), what an HTTP client sees of it."""
