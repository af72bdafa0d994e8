"""Where a server says how much of a prompt it reused: the one reader of reuse in a response, for `stable-prefix up`'s
live line, `stable-prefix report` and the bench's replay (engine_patch/http_api/usage_fields.py writes these fields).

Each server reports it its own way, and only its own figure counts, never a guess of ours:
- the Anthropic usage, `cache_read_input_tokens` beside `input_tokens` and `cache_creation_input_tokens` (the parts
  prefilled; the prompt is the three together): the patched engine, llama.cpp's `/v1/messages` (in `message_start`
  when streamed), vLLM's (whose answer not streamed counts what it prefilled and cached as created);
- the OpenAI usage, `prompt_tokens_details.cached_tokens` of `prompt_tokens` (chat completions) or
  `input_tokens_details.cached_tokens` of `input_tokens` (Responses): the patched engine, llama.cpp, vLLM with
  `--enable-prompt-tokens-details` (without it vLLM sends `prompt_tokens_details: null`);
- llama.cpp's `timings` object, `cache_n` tokens reused and `prompt_n` prefilled: beside the usage of a chat
  completion, in its last streamed chunk (where the usage chunk comes only if the client asked for
  `stream_options.include_usage`), and in a Responses stream's `response.completed` event (llama.cpp b11434,
  tools/server/server-common.cpp `server_slot_stats::to_json`).
A response that carries none of them has unknown reuse (`None`, shown as `?`), never 0.
"""

from __future__ import annotations

from typing import Any


def reuse_from_usage(usage: dict[str, Any]) -> tuple[int, int] | None:
    """(prompt tokens, reused tokens) from Anthropic, OpenAI or Responses API usage, when the server reported reuse."""
    reused, created = usage.get("cache_read_input_tokens"), usage.get("cache_creation_input_tokens")
    if isinstance(reused, int) or isinstance(created, int):
        return anthropic_prompt_tokens(usage), reused or 0
    for total, details in (("prompt_tokens", "prompt_tokens_details"), ("input_tokens", "input_tokens_details")):
        cached = (usage.get(details) or {}).get("cached_tokens")
        if isinstance(cached, int) and isinstance(usage.get(total), int):
            return usage[total], cached
    return None


def reuse_from_timings(timings: dict[str, Any]) -> tuple[int, int] | None:
    """(prompt tokens, reused tokens) from llama.cpp's `timings`: `cache_n` reused plus `prompt_n` prefilled."""
    reused, prefilled = timings.get("cache_n"), timings.get("prompt_n")
    if isinstance(reused, int) and isinstance(prefilled, int):
        return reused + prefilled, reused
    return None


def timings_in(payload: Any) -> dict[str, Any] | None:
    """llama.cpp's `timings` in one JSON payload (a whole response, or one streamed event's data), or None."""
    found = payload.get("timings") if isinstance(payload, dict) else None
    return found if isinstance(found, dict) else None


def reuse_reported(usage: dict[str, Any] | None, timings: dict[str, Any] | None = None) -> tuple[int, int] | None:
    """(prompt tokens, reused tokens) as the server reported them: its usage first (the protocol's own field), else
    llama.cpp's timings; None when it reported neither."""
    return reuse_from_usage(usage or {}) or reuse_from_timings(timings or {})


def reuse_in_record(response: dict[str, Any]) -> tuple[int, int] | None:
    """The reuse a capture record's response summary holds (its `usage` and `timings`, `addons/capture.py`)."""
    return reuse_reported(response.get("usage"), response.get("timings"))


def anthropic_prompt_tokens(usage: dict[str, Any]) -> int:
    """An Anthropic usage's prompt: the tokens after the last cache breakpoint, read from the cache and written to it."""
    return sum(usage.get(name) or 0 for name in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"))


def prompt_tokens_in_usage(usage: dict[str, Any]) -> int | None:
    """The prompt's size as the server counted it (Anthropic's three parts, OpenAI's prompt_tokens)."""
    if isinstance(usage.get("input_tokens"), int):
        return anthropic_prompt_tokens(usage)
    return usage.get("prompt_tokens") if isinstance(usage.get("prompt_tokens"), int) else None
