"""A response's usage object read for reuse, in every protocol the engine speaks: what `stable-prefix up`'s live
line shows and what the bench's replay counts (engine_patch/http_api/usage_fields.py writes these fields)."""

from __future__ import annotations

from typing import Any


def reuse_from_usage(usage: dict[str, Any]) -> tuple[int, int] | None:
    """(prompt tokens, reused tokens) from Anthropic, OpenAI or Responses API usage, when the server reported reuse."""
    reused = usage.get("cache_read_input_tokens")
    if isinstance(reused, int):
        return usage.get("input_tokens", 0) + reused, reused
    for total, details in (("prompt_tokens", "prompt_tokens_details"), ("input_tokens", "input_tokens_details")):
        cached = (usage.get(details) or {}).get("cached_tokens")
        if isinstance(cached, int) and isinstance(usage.get(total), int):
            return usage[total], cached
    return None


def prompt_tokens_in_usage(usage: dict[str, Any]) -> int | None:
    """The prompt's size as the server counted it (Anthropic input + cached input tokens, OpenAI prompt_tokens)."""
    if isinstance(usage.get("input_tokens"), int):
        return usage["input_tokens"] + (usage.get("cache_read_input_tokens") or 0)
    return usage.get("prompt_tokens") if isinstance(usage.get("prompt_tokens"), int) else None
