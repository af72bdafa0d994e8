"""The model families `build_tiny_model.py --family` can build besides Qwen2.

Each is a real mlx-lm architecture with tiny dimensions, Qwen's real BPE
vocabulary plus the family's own special tokens (ids after Qwen's), and a chat
template in the family's style, so that message boundaries look as they do in
the real models: ChatML `<|im_start|>` (Qwen3.5, Nemotron-H), Gemma
`<start_of_turn>` with the system prompt inside the first user turn, and
OpenAI's harmony `<|start|>` (gpt-oss). What matters for the engine cache is
the cache each architecture builds:

| family | mlx-lm layers | cache kinds |
|---|---|---|
| qwen3_5 | 3 gated-DeltaNet + 1 attention | ArraysCache x3, KVCache |
| gpt_oss | sliding + full attention, MoE | RotatingKVCache, KVCache |
| gemma3_text | 5 sliding + 1 full attention | RotatingKVCache x5, KVCache |
| nemotron_h | Mamba2, attention, Mamba2, MLP | ArraysCache, KVCache, ArraysCache |
| qwen3_next | Qwen3-Next-80B-A3B's layout: 48 layers, gated attention every 4th (2 KV heads x 256), gated-DeltaNet the rest | ArraysCache x36, KVCache x12 |

Windows are 64 tokens so that test prompts wrap them. Weights are float32:
mlx's CPU backend runs MoE (`gather_mm`) only in float32.

`qwen3_next` is the exception, built for the bytes bench (`bench/kv_bytes.py`): its
cache is the real model's, per token and per checkpoint (12 attention layers of 2 KV
heads x 256: 24 KiB per token at float16; 36 gated-DeltaNet layers whose recurrent
state, float32 as mlx-lm keeps it, and convolution state make ~74 MiB per checkpoint),
from Qwen3-Next-80B-A3B-Instruct's config.json (`QWEN3_NEXT_80B_A3B`); everything else
is tiny (hidden size 64, a dense MLP instead of 512 experts), so it runs in float16.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

VOCAB_SIZE = 151_936
SLIDING_WINDOW = 64


@dataclass(frozen=True)
class Shape:
    hidden_size: int
    layers: int
    heads: int
    kv_heads: int
    intermediate_size: int
    # The context the model declares (max_position_embeddings): what the engine refuses a prompt beyond.
    context_tokens: int = 32768
    # Attention head size; None: hidden_size / heads. Set apart from the hidden size, it gives a tiny model a
    # real model's KV cache per token (`build_tiny_model.py --kv-shape`) at a tiny model's cost per token.
    head_dim: int | None = None

    @property
    def attention_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.heads


@dataclass(frozen=True)
class Family:
    name: str
    config: Callable[[Shape], dict]
    chat_template: str
    # (content, special) of tokens added after Qwen2.5's, in id order.
    extra_tokens: list[tuple[str, bool]]
    eos_tokens: list[str]
    bos_token: str | None = None
    default_shape: Shape = field(default_factory=lambda: Shape(hidden_size=64, layers=4, heads=2, kv_heads=1, intermediate_size=128))


# Shared by the ChatML families: how content parts and tool definitions render.
# How a message's content renders: a string, or a list of text parts (the
# Qwen2 tiny model's template in build_tiny_model.py starts with it too).
RENDER_CONTENT_MACRO = r"""
{%- macro render_content(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- elif content is none -%}
    {%- elif content is mapping -%}
        {{- raise_exception('tiny model chat template: message content must be a string or a list of text parts, got an object') -}}
    {%- else -%}
        {%- for part in content -%}
            {%- if part is string -%}
                {{- part -}}
            {%- elif part.type == 'text' -%}
                {{- part.text -}}
            {%- else -%}
                {{- raise_exception('tiny model chat template: content part of type ' ~ part.type ~ ' is not supported (text only)') -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}"""

_CONTENT_MACRO = RENDER_CONTENT_MACRO + r"""
{%- macro render_tool_call(tool_call) -%}
    {%- if tool_call.function is defined %}{% set tool_call = tool_call.function %}{% endif -%}
    {{- '<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' -}}
    {%- if tool_call.arguments is string %}{{ tool_call.arguments }}{% else %}{{ tool_call.arguments | tojson }}{% endif -%}
    {{- '}\n</tool_call>' -}}
{%- endmacro -%}
{%- macro render_tools(tools) -%}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n<tools>" -}}
    {%- for tool in tools %}{{ "\n" + (tool | tojson) }}{% endfor -%}
    {{- "\n</tools>\n\nFor each function call, return a json object within <tool_call></tool_call> XML tags." -}}
{%- endmacro -%}
"""

# Qwen3-style ChatML: tools in the system turn, every tool result its own
# turn (prefix-stable), and a generation prompt with an empty thinking block,
# which the next turn does not repeat (as Qwen3.5 drops earlier reasoning).
CHATML_THINKING_TEMPLATE = (_CONTENT_MACRO + r"""
{%- if tools or (messages and messages[0].role == 'system') %}
    {{- '<|im_start|>system\n' }}
    {%- if messages and messages[0].role == 'system' %}{{ render_content(messages[0].content) }}{% endif %}
    {%- if tools %}{{ '\n\n' + render_tools(tools) }}{% endif %}
    {{- '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'system' %}
        {%- if not loop.first %}{{ '<|im_start|>system\n' + render_content(message.content) + '<|im_end|>\n' }}{% endif %}
    {%- elif message.role == 'user' %}
        {{- '<|im_start|>user\n' + render_content(message.content) + '<|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant\n' + render_content(message.content) }}
        {%- for tool_call in message.tool_calls or [] %}{{ '\n' + render_tool_call(tool_call) }}{% endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {{- '<|im_start|>user\n<tool_response>\n' + render_content(message.content) + '\n</tool_response><|im_end|>\n' }}
    {%- else %}
        {{- raise_exception('tiny model chat template: unknown message role ' ~ message.role) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n<think>\n\n</think>\n\n' }}{% endif %}
""").strip()

# Gemma 3: no system role; the system prompt (and here the tools) open the
# first user turn; the assistant is "model".
GEMMA_TEMPLATE = (_CONTENT_MACRO + r"""
{{- bos_token }}
{%- set head = namespace(text='') %}
{%- if messages and messages[0].role == 'system' %}{% set head.text = render_content(messages[0].content) + '\n\n' %}{% endif %}
{%- if tools %}{% set head.text = head.text + render_tools(tools) + '\n\n' %}{% endif %}
{%- for message in messages %}
    {%- if message.role == 'system' %}
        {%- if not loop.first %}{{ '<start_of_turn>user\n' + render_content(message.content) + '<end_of_turn>\n' }}{% endif %}
    {%- elif message.role == 'user' %}
        {{- '<start_of_turn>user\n' + head.text + render_content(message.content) + '<end_of_turn>\n' }}
        {%- set head.text = '' %}
    {%- elif message.role == 'assistant' %}
        {{- '<start_of_turn>model\n' + render_content(message.content) }}
        {%- for tool_call in message.tool_calls or [] %}{{ '\n' + render_tool_call(tool_call) }}{% endfor %}
        {{- '<end_of_turn>\n' }}
    {%- elif message.role == 'tool' %}
        {{- '<start_of_turn>user\n<tool_response>\n' + render_content(message.content) + '\n</tool_response><end_of_turn>\n' }}
    {%- else %}
        {{- raise_exception('tiny model chat template: unknown message role ' ~ message.role) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}
""").strip()

# OpenAI harmony (gpt-oss), reduced: a fixed system message, the user's
# system prompt and tools as the developer message, final-channel replies,
# tool calls on the commentary channel.
HARMONY_TEMPLATE = (_CONTENT_MACRO + r"""
{{- '<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>' }}
{%- if tools or (messages and messages[0].role == 'system') %}
    {{- '<|start|>developer<|message|># Instructions\n\n' }}
    {%- if messages and messages[0].role == 'system' %}{{ render_content(messages[0].content) }}{% endif %}
    {%- if tools %}
        {{- '\n\n# Tools\n\n## functions\n\nnamespace functions {\n' }}
        {%- for tool in tools %}
            {%- set fn = tool.function if tool.function is defined else tool %}
            {{- '\n// ' + (fn.description or '') + '\ntype ' + fn.name + ' = (_: ' + (fn.parameters | tojson) + ') => any;\n' }}
        {%- endfor %}
        {{- '\n} // namespace functions' }}
    {%- endif %}
    {{- '<|end|>' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'system' %}
        {%- if not loop.first %}{{ '<|start|>developer<|message|>' + render_content(message.content) + '<|end|>' }}{% endif %}
    {%- elif message.role == 'user' %}
        {{- '<|start|>user<|message|>' + render_content(message.content) + '<|end|>' }}
    {%- elif message.role == 'assistant' %}
        {%- set text = render_content(message.content) %}
        {%- if text %}{{ '<|start|>assistant<|channel|>final<|message|>' + text + '<|end|>' }}{% endif %}
        {%- for tool_call in message.tool_calls or [] %}
            {%- if tool_call.function is defined %}{% set tool_call = tool_call.function %}{% endif %}
            {{- '<|start|>assistant to=functions.' + tool_call.name + '<|channel|>commentary json<|message|>' }}
            {%- if tool_call.arguments is string %}{{ tool_call.arguments }}{% else %}{{ tool_call.arguments | tojson }}{% endif %}
            {{- '<|call|>' }}
        {%- endfor %}
    {%- elif message.role == 'tool' %}
        {{- '<|start|>functions.' + (message.name or 'tool') + ' to=assistant<|channel|>commentary<|message|>' + render_content(message.content) + '<|end|>' }}
    {%- else %}
        {{- raise_exception('tiny model chat template: unknown message role ' ~ message.role) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<|start|>assistant' }}{% endif %}
""").strip()

QWEN3_TOKENS = [("<tool_response>", False), ("</tool_response>", False), ("<think>", False), ("</think>", False)]


def qwen3_5_config(shape: Shape) -> dict:
    head_dim = shape.attention_head_dim
    return {
        "model_type": "qwen3_5",
        "architectures": ["Qwen3_5ForCausalLM"],
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": head_dim,
        "linear_num_value_heads": shape.heads,
        "linear_num_key_heads": shape.kv_heads,
        "linear_key_head_dim": head_dim,
        "linear_value_head_dim": head_dim,
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": 4,
        "rms_norm_eps": 1e-6,
        "vocab_size": VOCAB_SIZE,
        "tie_word_embeddings": True,
        "max_position_embeddings": shape.context_tokens,
        "rope_parameters": {"type": "default", "mrope_section": [2, 1, 1], "rope_theta": 100000, "partial_rotary_factor": 0.25},
    }


# Qwen/Qwen3-Next-80B-A3B-Instruct's config.json, the fields that shape its cache.
QWEN3_NEXT_80B_A3B = {
    "num_hidden_layers": 48,
    "full_attention_interval": 4,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_key_head_dim": 128,
    "linear_num_value_heads": 32,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "max_position_embeddings": 262144,
}


def qwen3_next_config(shape: Shape) -> dict:
    """The real model's linear-attention layout; layers, attention heads and head size from `shape`."""
    linear = {key: value for key, value in QWEN3_NEXT_80B_A3B.items() if key.startswith("linear_") or key == "full_attention_interval"}
    return linear | {
        "model_type": "qwen3_next",
        "architectures": ["Qwen3NextForCausalLM"],
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.attention_head_dim,
        # A dense MLP on every layer (num_experts 0): the experts hold no cache, and MoE would need float32 here.
        "num_experts": 0,
        "num_experts_per_tok": 0,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "moe_intermediate_size": shape.intermediate_size,
        "shared_expert_intermediate_size": shape.intermediate_size,
        "rms_norm_eps": 1e-6,
        "vocab_size": VOCAB_SIZE,
        "tie_word_embeddings": True,
        "rope_theta": 10000000,
        "partial_rotary_factor": 0.25,
        "max_position_embeddings": shape.context_tokens,
    }


def gpt_oss_config(shape: Shape) -> dict:
    return {
        "model_type": "gpt_oss",
        "architectures": ["GptOssForCausalLM"],
        "num_hidden_layers": shape.layers,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "vocab_size": VOCAB_SIZE,
        "rms_norm_eps": 1e-5,
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "head_dim": shape.attention_head_dim,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "sliding_window": SLIDING_WINDOW,
        "rope_theta": 150000,
        "rope_scaling": None,
        "layer_types": ["sliding_attention" if index % 2 == 0 else "full_attention" for index in range(shape.layers)],
    }


def gemma3_text_config(shape: Shape) -> dict:
    head_dim = shape.attention_head_dim
    return {
        "model_type": "gemma3_text",
        "architectures": ["Gemma3ForCausalLM"],
        "hidden_size": shape.hidden_size,
        "num_hidden_layers": shape.layers,
        "intermediate_size": shape.intermediate_size,
        "num_attention_heads": shape.heads,
        "head_dim": head_dim,
        "num_key_value_heads": shape.kv_heads,
        "vocab_size": VOCAB_SIZE,
        "rms_norm_eps": 1e-6,
        "sliding_window": SLIDING_WINDOW,
        "sliding_window_pattern": 6,
        "query_pre_attn_scalar": head_dim,
        "max_position_embeddings": shape.context_tokens,
    }


def nemotron_h_config(shape: Shape) -> dict:
    pattern = ["M", "*", "M", "-"]
    return {
        "model_type": "nemotron_h",
        "architectures": ["NemotronHForCausalLM"],
        "vocab_size": VOCAB_SIZE,
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.layers,
        "max_position_embeddings": shape.context_tokens,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.attention_head_dim,
        "attention_bias": False,
        "mamba_num_heads": 4,
        "mamba_head_dim": shape.hidden_size // 4,
        "mamba_proj_bias": False,
        "ssm_state_size": 16,
        "conv_kernel": 4,
        "n_groups": 1,
        "mlp_bias": False,
        "layer_norm_epsilon": 1e-5,
        "use_bias": False,
        "use_conv_bias": True,
        "hybrid_override_pattern": [pattern[index % len(pattern)] for index in range(shape.layers)],
        "time_step_limit": [0.0, 1e9],
        "time_step_min": 0.001,
        "time_step_max": 0.1,
    }


FAMILIES: dict[str, Family] = {
    "qwen3_5": Family("qwen3_5", qwen3_5_config, CHATML_THINKING_TEMPLATE, QWEN3_TOKENS, ["<|im_end|>"]),
    "gpt_oss": Family(
        "gpt_oss",
        gpt_oss_config,
        HARMONY_TEMPLATE,
        [(token, True) for token in ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>", "<|constrain|>")],
        ["<|return|>", "<|call|>"],
        default_shape=Shape(hidden_size=64, layers=2, heads=2, kv_heads=1, intermediate_size=64),
    ),
    "gemma3_text": Family(
        "gemma3_text",
        gemma3_text_config,
        GEMMA_TEMPLATE,
        [("<bos>", True), ("<eos>", True), ("<start_of_turn>", True), ("<end_of_turn>", True)],
        ["<end_of_turn>", "<eos>"],
        bos_token="<bos>",
        default_shape=Shape(hidden_size=64, layers=6, heads=2, kv_heads=1, intermediate_size=128),
    ),
    "nemotron_h": Family("nemotron_h", nemotron_h_config, CHATML_THINKING_TEMPLATE, QWEN3_TOKENS, ["<|im_end|>"]),
    "qwen3_next": Family(
        "qwen3_next",
        qwen3_next_config,
        CHATML_THINKING_TEMPLATE,
        QWEN3_TOKENS,
        ["<|im_end|>"],
        default_shape=Shape(
            hidden_size=64, layers=QWEN3_NEXT_80B_A3B["num_hidden_layers"], heads=QWEN3_NEXT_80B_A3B["num_key_value_heads"],
            kv_heads=QWEN3_NEXT_80B_A3B["num_key_value_heads"], intermediate_size=128,
            context_tokens=QWEN3_NEXT_80B_A3B["max_position_embeddings"], head_dim=QWEN3_NEXT_80B_A3B["head_dim"],
        ),
    ),
}
