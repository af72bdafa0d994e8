"""The continuous-batching scheduler's seams (the default engine): cached prompts into mlx-lm's BatchGenerator, admission at add_request.

Imports the rooms below vllm_mlx/ and vllm-mlx itself; never SimpleEngine's folder.
"""
