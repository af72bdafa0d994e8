"""The fuzz tests' property: what the proxy forwarded is the client's body, or
that body after the documented rules (docs/proxy.md), and nothing else.

`problems(...)` compares the body a client sent with the one that left the
proxy, both parsed, and names every way they differ beyond the rules:

- every line of text is still there (as often as it was), except a billing
  header line of the system prompt (a line that starts with
  `x-anthropic-billing-header:`; in user or assistant text it stays);
- nothing new: a line that was not in the client's body is a wrapper the rules
  add (`<system-reminder>`, `<functions>`) or the schema of a client's tool;
- every tool offered is still in `tools` or inlined, with its schema, into a
  tool result; no tool is added;
- every id (`id`, `tool_use_id`, `tool_call_id`, `call_id`,
  `previous_response_id`) is kept, as often as it was;
- no top-level field is added, and only `system` may go (a system prompt that
  held nothing but the billing header); no number or flag is added or changed
  except `max_tokens` by the cap, the model name by the mapping.

Written from the documentation, not from the rules' code: `role` (a system
message becomes a user message), `type` and `tool_name` (a tool reference is
replaced by the tool's schema) are not compared as text.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from mitmproxy.net import encoding

from tests.support.fuzz_bodies import WireRequest

ID_KEYS = frozenset({"id", "tool_use_id", "tool_call_id", "call_id", "previous_response_id"})
NOT_TEXT_KEYS = frozenset({"role", "type", "tool_name", "model"})
CAPPED_KEYS = frozenset({"max_tokens", "max_completion_tokens", "max_output_tokens"})
WRAPPER_LINES = frozenset({"<system-reminder>", "</system-reminder>", "<functions>", "</functions>"})
BILLING_LINE = re.compile(r"^[ \t]*x-anthropic-billing-header:", re.IGNORECASE)
FUNCTION_LINE = re.compile(r"^<function>(\{.*\})</function>$")


def _json_list_string(text: str) -> list | None:
    """A string holding a JSON list of blocks (claude-code-router's tool results), parsed."""
    if not text.startswith("["):
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, list) else None


def text_strings(value: Any, key: Any = None) -> Iterator[str]:
    """The text of a value: its strings, but not `role`, `type`, `tool_name` or `model`."""
    if key in NOT_TEXT_KEYS:
        return
    if isinstance(value, str):
        blocks = _json_list_string(value)
        if blocks is None:
            yield value
        else:
            yield from text_strings(blocks)
    elif isinstance(value, dict):
        for child_key, child in value.items():
            yield from text_strings(child, child_key)
    elif isinstance(value, list):
        for child in value:
            yield from text_strings(child)


def lines_of(text: str) -> list[str]:
    """Lines as the rules and a reader see them: ended by \n (a \r before it is part of the break)."""
    return [line.removesuffix("\r") for line in text.split("\n")]


def text_lines(strings) -> Counter:
    return Counter(line for text in strings for line in lines_of(text) if line.strip())


def _without_tools(body: dict) -> dict:
    return {key: value for key, value in body.items() if key != "tools"}


def _pairs(value: Any, wanted: Callable[[Any, Any], bool], key: Any = None) -> Iterator[tuple[Any, str]]:
    if wanted(key, value):
        yield key, json.dumps(value, sort_keys=True)
    if isinstance(value, dict):
        for child_key, child in value.items():
            yield from _pairs(child, wanted, child_key)
    elif isinstance(value, list):
        for child in value:
            yield from _pairs(child, wanted)


def _is_id(key: Any, value: Any) -> bool:
    return key in ID_KEYS and isinstance(value, str)


def _is_scalar(key: Any, value: Any) -> bool:
    return key not in CAPPED_KEYS and (value is None or isinstance(value, (bool, int, float)))


def _tool_name(tool: Any) -> str | None:
    if not isinstance(tool, dict):
        return None
    function = tool.get("function") if isinstance(tool.get("function"), dict) else tool
    return function.get("name") if isinstance(function.get("name"), str) else None


def _tool_schema(tool: dict) -> tuple[Any, Any]:
    function = tool.get("function") if isinstance(tool.get("function"), dict) else tool
    return function.get("description", ""), function.get("parameters", function.get("input_schema", {}))


def inlined_entries(lines: Counter) -> dict[str, dict]:
    """The tools written into tool results, by name (`<function>{...}</function>` lines)."""
    entries = {}
    for line in lines:
        match = FUNCTION_LINE.match(line)
        if match:
            entry = json.loads(match.group(1))
            entries[entry["name"]] = entry
    return entries


def problems(client: dict, forwarded: dict, system_texts: Callable[[dict], list[str]],
             *, served_model: str | None = None, max_tokens_cap: int = 0) -> list[str]:
    found: list[str] = []
    client_lines = text_lines(text_strings(_without_tools(client)))
    forwarded_lines = text_lines(text_strings(_without_tools(forwarded)))
    billing = text_lines(line for text in system_texts(client) for line in lines_of(text) if BILLING_LINE.match(line))
    for line, count in (client_lines - billing).items():
        if forwarded_lines[line] < count:
            found.append(f"line lost: {line[:120]!r} ({count}x sent, {forwarded_lines[line]}x forwarded)")
    client_tools = client.get("tools") if isinstance(client.get("tools"), list) else []
    tool_lines = text_lines(text_strings(client_tools))
    entries = inlined_entries(forwarded_lines)
    for line in forwarded_lines - client_lines:
        if line not in WRAPPER_LINES and line not in tool_lines and not FUNCTION_LINE.match(line):
            found.append(f"line added: {line[:120]!r}")
    found += _tool_problems(client, forwarded, client_tools, entries)
    client_ids, forwarded_ids = Counter(_pairs(client, _is_id)), Counter(_pairs(forwarded, _is_id))
    if client_ids != forwarded_ids:
        found.append(f"ids differ: lost {sorted(client_ids - forwarded_ids)[:5]}, added {sorted(forwarded_ids - client_ids)[:5]}")
    added_scalars = Counter(_pairs(_without_tools(forwarded), _is_scalar)) - Counter(_pairs(_without_tools(client), _is_scalar))
    if added_scalars:
        found.append(f"numbers or flags added or changed: {sorted(added_scalars)[:5]}")
    found += _top_level_problems(client, forwarded, served_model, max_tokens_cap)
    return found


def _tool_problems(client: dict, forwarded: dict, client_tools: list, entries: dict[str, dict]) -> list[str]:
    found = []
    if "tools" in forwarded and "tools" not in client:
        found.append("tools added")
    forwarded_tools = forwarded.get("tools") if isinstance(forwarded.get("tools"), list) else []
    sent = [json.dumps(tool, sort_keys=True) for tool in client_tools]
    for tool in forwarded_tools:
        if json.dumps(tool, sort_keys=True) not in sent:
            found.append(f"tool added or changed: {json.dumps(tool)[:120]}")
    kept = [json.dumps(tool, sort_keys=True) for tool in forwarded_tools]
    for tool, key in zip(client_tools, sent):
        if key in kept:
            continue
        name = _tool_name(tool)
        entry = entries.get(name) if name else None
        description, parameters = _tool_schema(tool) if isinstance(tool, dict) else (None, None)
        if entry is None or entry.get("description") != description or entry.get("parameters") != parameters:
            found.append(f"tool neither offered nor inlined: {name!r}")
    for name, entry in entries.items():
        if not any(_tool_name(tool) == name for tool in client_tools):
            found.append(f"inlined a tool the client did not offer: {name!r} {json.dumps(entry)[:80]}")
    return found


def _top_level_problems(client: dict, forwarded: dict, served_model: str | None, max_tokens_cap: int) -> list[str]:
    found = []
    if set(forwarded) - set(client):
        found.append(f"fields added: {sorted(set(forwarded) - set(client))}")
    # The system prompt's own field may go: the billing rule removes a system prompt it leaves empty.
    dropped = set(client) - set(forwarded) - {"system", "instructions"}
    if dropped:
        found.append(f"fields dropped: {sorted(dropped)}")
    if "model" in client:
        expected = served_model if served_model and isinstance(client["model"], str) else client["model"]
        if forwarded.get("model") != expected:
            found.append(f"model {client['model']!r} forwarded as {forwarded.get('model')!r}, expected {expected!r}")
    for key in CAPPED_KEYS & set(client):
        value = client[key]
        capped = isinstance(value, int) and not isinstance(value, bool) and max_tokens_cap and value > max_tokens_cap
        expected = max_tokens_cap if capped else value
        if forwarded.get(key) != expected:
            found.append(f"{key} {value!r} forwarded as {forwarded.get(key)!r}, expected {expected!r}")
    return found


def exchange_problems(wire: WireRequest, forwarded_raw: bytes, forwarded_headers: Mapping[str, str],
                      *, served_model: str | None, max_tokens_cap: int) -> list[str]:
    """What is wrong with what left the proxy for `wire`: a body the proxy must
    not read (a defect, a path its rules do not cover) must leave byte for
    byte; a readable one byte for byte, or as valid UTF-8 JSON, in its
    content-encoding, with a correct content-length, that passes `problems`."""
    for name in ("content-type", "content-encoding"):
        if forwarded_headers.get(name) != wire.header(name):
            return [f"{name} {wire.header(name)!r} forwarded as {forwarded_headers.get(name)!r}"]
    if forwarded_raw == wire.content:
        return []
    if wire.defect is not None or not wire.protocol.normalized:
        return [f"changed although it must pass untouched ({wire.defect or 'a path the rules do not cover'})"]
    length = forwarded_headers.get("content-length")
    if length is not None and int(length) != len(forwarded_raw):
        return [f"content-length {length} for {len(forwarded_raw)} bytes"]
    try:
        text = encoding.decode(forwarded_raw, wire.header("content-encoding") or "identity").decode("utf-8")
        forwarded = json.loads(text)
    except ValueError as error:
        return [f"forwarded body is not valid UTF-8 JSON in its content-encoding: {error}"]
    client = json.loads(encoding.decode(wire.content, wire.header("content-encoding") or "identity"))
    return problems(client, forwarded, wire.protocol.system_texts, served_model=served_model, max_tokens_cap=max_tokens_cap)
