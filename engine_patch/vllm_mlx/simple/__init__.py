"""SimpleEngine's seams: its generation through mlx_lm.stream_generate with the cache, the context check and abandoned prefills there.

Every attribute of vllm-mlx's and mlx-lm's wrapped here is a row of one table, `seams.py`, whose `install()` puts them in.

Imports the rooms below vllm_mlx/ and vllm-mlx itself; never the batched engine's folder.
"""
