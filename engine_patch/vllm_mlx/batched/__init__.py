"""The continuous-batching scheduler's seams (the default engine): cached prompts into mlx-lm's BatchGenerator, admission at add_request.

Every method of vllm-mlx's and mlx-lm's wrapped here is a row of one table, `seams.py`, whose `install()` puts them in.

Imports the rooms below vllm_mlx/ and vllm-mlx itself; never SimpleEngine's folder.
"""
