"""Strict json_schema requests become json_object requests for models that stall on them.

    mitmdump --mode reverse:http://127.0.0.1:8000 --listen-host 127.0.0.1 -s addons/json_mode_guard.py \\
        [--set json_mode_guard_models='*Coder*A3B*'] [--set json_mode_guard=false]

`response_format: {"type": "json_schema", ...}` (LangChain's default for
`with_structured_output`) makes vllm-mlx decode under a grammar; on sparse-MoE
Coder models such as Qwen3-Coder-30B-A3B that stalled the server for minutes per
call (vllm-mlx issue #546), and every queued request (Claude Code's included)
waited behind it. For models matching `json_mode_guard_models` this addon asks
for `{"type": "json_object"}` instead and puts the schema into the system
message as guidance, so the reply still aims at the schema, without the grammar.
The rewrite is logged, noted in `flow.comment` and the flow is marked. Other
models, other `response_format`s and unreadable bodies go through byte for byte.

Load it after strip_billing.py when both run: strip_billing maps the model name
to the served one, and the pattern is meant to match the served name.
"""

from __future__ import annotations

import fnmatch
import json
import logging
from typing import Any

from mitmproxy import ctx, exceptions, http

from stable_prefix.addons.request_body import LeftAlone, api_of, read_json_body, write_json_body

logger = logging.getLogger(__name__)

DEFAULT_MODEL_PATTERNS = "*Coder*A3B*"
MARKER = ":triangular_ruler:"
METADATA_KEY = "json_mode_guard"


def parse_model_patterns(value: str) -> tuple[str, ...]:
    patterns = tuple(pattern.strip() for pattern in value.split(",") if pattern.strip())
    if not patterns:
        raise exceptions.OptionsError(
            f"json_mode_guard_models: {value!r} names no model pattern; to switch the guard off use json_mode_guard=false"
        )
    return patterns


def model_matches(model: Any, patterns: tuple[str, ...]) -> bool:
    """Shell-style patterns, case-insensitive (served names differ in case: Qwen3-Coder, qwen3-coder)."""
    return isinstance(model, str) and any(fnmatch.fnmatch(model.lower(), pattern.lower()) for pattern in patterns)


def schema_guidance(json_schema: dict[str, Any]) -> str:
    """The system-message text that stands in for the grammar."""
    name = json_schema.get("name")
    description = json_schema.get("description")
    schema = json_schema.get("schema", {})
    title = f' "{name}"' if isinstance(name, str) and name else ""
    about = f" ({description})" if isinstance(description, str) and description else ""
    return (
        f"Reply with a single JSON object and nothing else (no prose, no code fences). "
        f"It must conform to this JSON schema{title}{about}:\n"
        f"{json.dumps(schema, ensure_ascii=False)}"
    )


def add_system_guidance(messages: list[Any], text: str) -> None:
    """Append `text` to the leading system message, or start the conversation with one."""
    first = messages[0] if messages else None
    if isinstance(first, dict) and first.get("role") in ("system", "developer"):
        content = first.get("content")
        if isinstance(content, str):
            first["content"] = f"{content}\n\n{text}" if content else text
            return
        if isinstance(content, list):
            content.append({"type": "text", "text": text})
            return
    messages.insert(0, {"role": "system", "content": text})


def downgrade_json_schema(body: dict[str, Any], patterns: tuple[str, ...]) -> str | None:
    """Rewrite a matching request in place; what was done, or None when the request is not one to touch."""
    response_format = body.get("response_format")
    if not isinstance(response_format, dict) or response_format.get("type") != "json_schema":
        return None
    if not model_matches(body.get("model"), patterns) or not isinstance(body.get("messages"), list):
        return None
    json_schema = response_format.get("json_schema")
    json_schema = json_schema if isinstance(json_schema, dict) else {}
    body["response_format"] = {"type": "json_object"}
    add_system_guidance(body["messages"], schema_guidance(json_schema))
    strict = " strict" if json_schema.get("strict") else ""
    name = json_schema.get("name", "unnamed")
    return (
        f"json_mode_guard: model {body['model']!r}:{strict} response_format json_schema {name!r} sent as json_object, "
        f"schema moved into the system message (grammar decoding stalls this model, vllm-mlx #546)"
    )


class JsonModeGuard:
    def __init__(self) -> None:
        self.patterns = parse_model_patterns(DEFAULT_MODEL_PATTERNS)

    def load(self, loader) -> None:
        loader.add_option(
            "json_mode_guard",
            bool,
            True,
            'Rewrite response_format "json_schema" to "json_object" (schema into the system message) '
            "for models matching json_mode_guard_models.",
        )
        loader.add_option(
            "json_mode_guard_models",
            str,
            DEFAULT_MODEL_PATTERNS,
            "Comma-separated shell patterns (case-insensitive) of model names whose json_schema requests are "
            "rewritten; default: sparse-MoE Coder models.",
        )

    def configure(self, updated) -> None:
        if "json_mode_guard_models" in updated:
            self.patterns = parse_model_patterns(ctx.options.json_mode_guard_models)

    def request(self, flow: http.HTTPFlow) -> None:
        if not ctx.options.json_mode_guard or flow.response or api_of(flow.request) != "openai":
            return
        body = read_json_body(flow.request)
        if isinstance(body, LeftAlone):
            return
        change = downgrade_json_schema(body, self.patterns)
        if change is None:
            return
        write_json_body(flow.request, body)
        logger.info(f"{flow.request.path}: {change}")
        flow.comment = f"{flow.comment}\n{change}" if flow.comment else change
        flow.marked = flow.marked or MARKER  # another addon's mark (a broken prefix...) says more
        flow.metadata[METADATA_KEY] = change


addons = [JsonModeGuard()]
