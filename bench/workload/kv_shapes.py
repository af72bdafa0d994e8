"""The real models' cache layouts the bytes bench runs at, and the budgets it gives them.

Each shape is a tiny preset built with that model's KV cache per token
(`tools/build_tiny_model.py --kv-shape`, `--family qwen3_next`): its bytes per
token and per checkpoint are the real model's, read from the preset's config.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from stable_prefix.engine_patch.disk.disk_tier import DEFAULT_BUDGET_BYTES
from stable_prefix.servers import REPO_ROOT

GiB = 2**30
# A quarter of a 64 GB Mac, the engine's default share of RAM (engine_patch/__main__.py).
RAM_BUDGET_BYTES = 16 * GiB
DISK_BUDGET_BYTES = DEFAULT_BUDGET_BYTES


@dataclass(frozen=True)
class KvShape:
    """A real model's cache layout, through the tiny preset that has it."""

    key: str
    title: str
    model: Path
    layers: int
    # A run may take layers in multiples of this and keep every byte proportional (a hybrid: whole
    # groups of its attention interval, so the share of attention layers stays the real one).
    layer_step: int = 1

    def layer_counts(self) -> list[int]:
        """The layer counts a run may take, most first."""
        return [count for count in range(self.layers, 0, -1) if self.layers % count == 0 and count % self.layer_step == 0]


SHAPES = {
    shape.key: shape
    for shape in (
        KvShape("32b", "Qwen2.5-Coder-32B-shaped (dense: 64 layers x 8 KV heads x 128, 256 KiB/token)",
                REPO_ROOT / "build" / "tiny-kv-qwen2.5-coder-32b", 64),
        KvShape("30b-a3b", "Qwen3-Coder-30B-A3B-shaped (MoE: 48 layers x 4 KV heads x 128, 96 KiB/token)",
                REPO_ROOT / "build" / "tiny-kv-qwen3-coder-30b", 48),
        KvShape("next", "Qwen3-Next-80B-A3B-shaped hybrid (12 attention layers x 2 KV heads x 256, 24 KiB/token; 36 gated-DeltaNet layers)",
                REPO_ROOT / "build" / "tiny-kv-qwen3-next", 48, layer_step=4),
        KvShape("tiny", "make demo's tiny model (2 layers x 1 KV head x 64, 512 B/token)", REPO_ROOT / "build" / "tiny-model", 2),
    )
}
REAL_SHAPES = ("32b", "30b-a3b", "next")


def model_bytes(model_dir: Path) -> tuple[int, int]:
    """(KV bytes per token, bytes of one checkpoint of the positional layers) of the preset at full size."""
    config = json.loads((model_dir / "config.json").read_text())
    dtype_bytes = {"float16": 2, "bfloat16": 2, "float32": 4}[config.get("torch_dtype", "float16")]
    layers = config["num_hidden_layers"]
    interval = config.get("full_attention_interval")
    attention = layers // interval if interval else layers
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    per_token = attention * 2 * config["num_key_value_heads"] * head_dim * dtype_bytes
    if not interval:
        return per_token, 0
    # Gated DeltaNet: a float32 recurrent state (value heads x value dim x key dim) and the convolution's
    # last kernel-1 inputs (2 x keys + values wide), per linear layer (mlx-lm's qwen3_next).
    keys = config["linear_num_key_heads"] * config["linear_key_head_dim"]
    values = config["linear_num_value_heads"] * config["linear_value_head_dim"]
    state = config["linear_num_value_heads"] * config["linear_value_head_dim"] * config["linear_key_head_dim"] * 4
    convolution = (config["linear_conv_kernel_dim"] - 1) * (2 * keys + values) * dtype_bytes
    return per_token, (layers - attention) * (state + convolution)
