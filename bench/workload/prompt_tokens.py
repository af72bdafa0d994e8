"""The token ids an engine prefills for a request, computed without a server.

The benchmark needs them to know what an *ideal* cache could have reused: the
longest common token prefix of a request with any earlier request of the run.
The ids must be the ones the engine really sees, so this calls vllm-mlx's own
conversion steps in the order its Anthropic route and SimpleEngine run them
(Anthropic -> OpenAI request, message preparation incl. its billing-line
canonicalization and system-message hoisting, tool conversion, chat template,
encode). Only the server and engine objects are left out; none of these steps
depends on model weights. `tests/bench/test_bench_smoke.py` checks the counts against
the prompt sizes the servers report. `MlxLmPromptRenderer` does the same for
mlx_lm.server and a chat-completions body.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np


def _keeps_native_tool_format(tool_call_parser: str | None) -> bool:
    """Whether the server, started with this `--tool-call-parser` (and auto tool choice),
    hands tool calls and results to the chat template as such instead of as text."""
    if not tool_call_parser:
        return False
    from vllm_mlx.tool_parsers import ToolParserManager

    return bool(ToolParserManager.get_tool_parser(tool_call_parser).supports_native_format())


class PromptRenderer:
    """Renders request bodies to prompt token ids as a server with this model and these flags does."""

    def __init__(self, model_dir: Path, served_model_name: str | None = None, tool_call_parser: str | None = None):
        # Only the tokenizer is used; transformers' note that PyTorch is absent is noise here.
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        # SimpleEngine enables thinking unless the model name says "coder".
        self.enable_thinking = "coder" not in (served_model_name or str(model_dir)).lower()
        # What _prepare_chat_messages reads from the engine, for a text-only model.
        self.engine_view = SimpleNamespace(
            is_mllm=False, preserve_native_tool_format=_keeps_native_tool_format(tool_call_parser), use_harmony_rendering=False
        )

    def prompt_text(self, body: dict[str, Any]) -> str:
        from vllm_mlx import server
        from vllm_mlx.api.anthropic_adapter import anthropic_to_openai
        from vllm_mlx.api.anthropic_models import AnthropicRequest
        from vllm_mlx.api.tool_calling import convert_tools_for_template
        from vllm_mlx.engine.chat_template_safety import normalize_messages_for_chat_template

        request = anthropic_to_openai(AnthropicRequest(**body))
        messages, *_ = server._prepare_chat_messages(self.engine_view, request.messages)
        template_kwargs: dict[str, Any] = {
            "tokenize": False,
            "add_generation_prompt": True,
            "enable_thinking": self.enable_thinking,
        }
        if request.tools and request.tool_choice != "none":
            # Converted twice, as the route and then the engine do; the second pass is a no-op.
            template_kwargs["tools"] = convert_tools_for_template(convert_tools_for_template(request.tools))
        return self.tokenizer.apply_chat_template(normalize_messages_for_chat_template(messages), **template_kwargs)

    def token_ids(self, body: dict[str, Any]) -> list[int]:
        prompt = self.prompt_text(body)
        bos = self.tokenizer.bos_token
        return self.tokenizer.encode(prompt, add_special_tokens=bos is None or not prompt.startswith(bos))


class MlxLmPromptRenderer:
    """Renders chat-completions bodies to prompt token ids as mlx_lm.server does (`_tokenize`)."""

    def __init__(self, model_dir: Path):
        from mlx_lm.utils import load_tokenizer

        self.tokenizer = load_tokenizer(Path(model_dir))

    def token_ids(self, body: dict[str, Any]) -> list[int]:
        from mlx_lm.server import process_message_content

        messages = copy.deepcopy(body["messages"])
        process_message_content(messages)
        return list(self.tokenizer.apply_chat_template(messages, tools=body.get("tools") or None, tokenize=True, add_generation_prompt=True))


def common_prefix_length(a: list[int] | np.ndarray, b: list[int] | np.ndarray) -> int:
    """Number of leading token ids that `a` and `b` share."""
    length = min(len(a), len(b))
    if length == 0:
        return 0
    differs = np.asarray(a[:length]) != np.asarray(b[:length])
    return int(np.argmax(differs)) if differs.any() else length


def ideal_reusable_tokens(prompts: list[list[int]]) -> list[int]:
    """For each prompt, the longest prefix it shares with ANY earlier prompt of the run.

    That is what a cache holding every earlier request's KV state could reuse. It
    is capped at `len(prompt) - 1`: an engine must compute at least the last
    prompt token to get logits for the first output token.
    """
    reusable = []
    for index, prompt in enumerate(prompts):
        best = max((common_prefix_length(prompt, earlier) for earlier in prompts[:index]), default=0)
        reusable.append(min(best, max(0, len(prompt) - 1)))
    return reusable
