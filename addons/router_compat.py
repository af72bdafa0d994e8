"""What a router that parses a request into a strict schema (smg 1.13) accepts,
made to change nothing the engine reads (`strict_router_body`, off by default;
a team's proxy before smg turns it on).

Only what vllm-mlx 0.6.0 ignores anyway is dropped: its pydantic request
models read no other field (`STRICT_ROUTER_MESSAGE_FIELDS`,
`ENGINE_RESPONSES_FIELDS`; `tests/stable_prefix/routers/test_strict_router_body.py` checks them
against the models). On the Responses path smg sets `temperature: 1.0` on a
request without one, where the engine would sample at its own default: the
rule writes that default (`ENGINE_DEFAULT_TEMPERATURE`) so the router changes
nothing. What it does for a user: `OPTION`'s help.
"""

from __future__ import annotations

from stable_prefix.addons.request_shape import Api
from stable_prefix.addons.rules.base import Change, Option

STRICT_ROUTER = "strict_router"
OPTION = Option(
    "strict_router_body", bool, False,
    "Make bodies what a router with a strict schema (smg) accepts, dropping only fields vllm-mlx ignores: "
    "an Anthropic message's fields besides role and content (Claude Code's output_config), thinking whose "
    "budget_tokens is not below max_tokens, a Responses request's fields smg refuses and the engine ignores (Codex's "
    "client_metadata); a Responses request without temperature gets the engine's default (smg would set 1.0). Each drop is logged. "
    "For a team's proxy before smg; off: bodies as the rules leave them.",
)
# What vllm-mlx 0.6.0 reads of an Anthropic message (`api/anthropic_models.py: AnthropicMessage`); the rest is ignored.
STRICT_ROUTER_MESSAGE_FIELDS = ("role", "content")
# What vllm-mlx 0.6.0 reads of a Responses request (`api/responses_models.py: ResponsesRequest`).
ENGINE_RESPONSES_FIELDS = ("model", "input", "instructions", "max_output_tokens", "stream", "tools", "tool_choice",
                           "parallel_tool_calls", "previous_response_id", "temperature", "top_p", "chat_template_kwargs",
                           "metadata", "text", "reasoning", "store", "truncation", "user")
# The top-level fields smg 1.13's Responses schema accepts (its 400 lists them); any other is refused.
STRICT_ROUTER_RESPONSES_FIELDS = ("include", "background", "input", "instructions", "max_output_tokens", "max_tool_calls", "metadata",
                                  "model", "conversation", "parallel_tool_calls", "previous_response_id", "reasoning", "service_tier",
                                  "store", "stream", "temperature", "tool_choice", "tools", "top_logprobs", "top_p", "truncation", "text",
                                  "user", "request_id", "priority", "frequency_penalty", "presence_penalty", "stop", "prompt",
                                  "prompt_cache_key", "prompt_cache_retention", "safety_identifier", "stream_options",
                                  "context_management", "top_k", "min_p", "repetition_penalty")
# vllm-mlx 0.6.0's temperature for a request without one (`server.py: _FALLBACK_TEMPERATURE`; a replica's
# --default-temperature replaces it: then set the same temperature in the client).
ENGINE_DEFAULT_TEMPERATURE = 0.7


def fit_strict_router(body: dict, api: Api) -> list[Change]:
    """Anthropic: a message's fields besides role and content go (Claude Code 2.1.332's environment
    message carries `output_config`, and smg answers 400 `unknown field`), and `thinking` whose
    `budget_tokens` is not below `max_tokens` (after the cap; smg answers 400)."""
    if api == "responses":
        return _fit_strict_responses(body)
    if api != "anthropic":
        return []
    changes = []
    for index, message in enumerate(body.get("messages") or []):
        if not isinstance(message, dict):
            continue
        extra = [field for field in message if field not in STRICT_ROUTER_MESSAGE_FIELDS]
        for field in extra:
            del message[field]
        if extra:
            changes.append(Change(STRICT_ROUTER, f"messages[{index}]", f"dropped {', '.join(extra)} (the engine reads role and content only)"))
    thinking, max_tokens = body.get("thinking"), body.get("max_tokens")
    budget = thinking.get("budget_tokens") if isinstance(thinking, dict) else None
    if isinstance(budget, int) and isinstance(max_tokens, int) and budget >= max_tokens:
        del body["thinking"]
        changes.append(Change(STRICT_ROUTER, "thinking", f"dropped (budget_tokens {budget} >= max_tokens {max_tokens}; the engine ignores thinking)"))
    return changes


def _fit_strict_responses(body: dict) -> list[Change]:
    """Fields smg refuses that the engine ignores go (Codex's `client_metadata`); one the engine reads stays,
    refused or not; a missing temperature becomes the engine's own default (smg would set 1.0)."""
    changes = []
    ignored = [field for field in body if field not in STRICT_ROUTER_RESPONSES_FIELDS and field not in ENGINE_RESPONSES_FIELDS]
    for field in ignored:
        del body[field]
    if ignored:
        changes.append(Change(STRICT_ROUTER, ignored[0] if len(ignored) == 1 else "body",
                              f"dropped {', '.join(ignored)} (smg refuses it, the engine ignores it)"))
    if "temperature" not in body:
        body["temperature"] = ENGINE_DEFAULT_TEMPERATURE
        changes.append(Change(STRICT_ROUTER, "temperature", f"set to the engine's default {ENGINE_DEFAULT_TEMPERATURE} (smg would set 1.0)"))
    return changes
