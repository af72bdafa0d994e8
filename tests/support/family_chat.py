"""Claude Code-shaped chats for the tiny models, in process: lanes of growing
conversations with one system prompt and tool list, and greedy tokens through
mlx-lm's own stream_generate or the cached one."""

from __future__ import annotations

import contextvars

import mlx_lm
from mlx_lm.sample_utils import make_sampler

from stable_prefix.engine_patch.cache.prompt_boundaries import generation_prompt_start, message_start_ids
from stable_prefix.engine_patch.cache.prompt_head import set_head_text
from stable_prefix.engine_patch.cache.request_reuse import RequestReuse, begin_request

from .models import REPO_ROOT, TEST_MODEL

ORIGINAL_STREAM_GENERATE = mlx_lm.stream_generate
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file.",
                                           "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]
SYSTEM = "You are a careful coding agent. Read before you edit, and say what you changed. " * 4
TURNS = ["Look at src/app.py.", "It parses the request.", "Check the tests too.", "They cover the happy path.", "Add an error test."]
FAMILY_MODELS = {"qwen2": TEST_MODEL, **{family: REPO_ROOT / "build" / f"tiny-{family}"
                                         for family in ("qwen3_5", "gpt_oss", "gemma3_text", "nemotron_h")}}


def prompt(tokenizer, lane: str, turns: int, system: str = SYSTEM) -> str:
    """The lane's conversation after `turns` messages (user first), rendered for generation."""
    messages = [{"role": "system", "content": system}]
    for index, text in enumerate(TURNS[:turns]):
        messages.append({"role": "user" if index % 2 == 0 else "assistant", "content": f"[{lane}] {text}" if index == 0 else text})
    return tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True)


def greedy(stream_generate, model, tokenizer, text: str, max_tokens: int = 6) -> list[int]:
    return [response.token for response in stream_generate(model, tokenizer, text, max_tokens, sampler=make_sampler(temp=0.0))]


def chat_head(tokenizer, system: str = SYSTEM) -> str | None:
    """The system + tools head as a patched server hands it to the generation (vllm-mlx's own probe)."""
    from vllm_mlx.engine.chat_template_safety import build_system_prompt_cache_prefix

    return build_system_prompt_cache_prefix(tokenizer, [{"role": "system", "content": system}],
                                            template_kwargs={"tools": TOOLS, "tokenize": False, "add_generation_prompt": True})


def served(generation, model, tokenizer, text: str, head: str | None = None) -> tuple[list[int], RequestReuse]:
    """Greedy tokens of one request through the cached `generation` (told the chat's `head`, as a
    server does), and what it reused."""

    def request() -> tuple[list[int], RequestReuse]:
        reuse, _ = begin_request()
        if head is not None:
            set_head_text(lambda: head)
        return greedy(generation, model, tokenizer, text), reuse

    return contextvars.copy_context().run(request)


def resume_position(tokenizer, text: str) -> int:
    """Where the next turn of this prompt's conversation can resume: its generation prompt's start."""
    return generation_prompt_start(tokenizer.encode(text, add_special_tokens=False), message_start_ids(tokenizer))
