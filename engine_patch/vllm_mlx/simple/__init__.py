"""SimpleEngine's seams: its generation through mlx_lm.stream_generate with the cache, the context check and abandoned prefills there.

Imports the rooms below vllm_mlx/ and vllm-mlx itself; never the batched engine's folder.
"""
