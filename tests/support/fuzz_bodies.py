"""Request bodies for the fuzz tests, per protocol, and the bytes they go out as.

A `Protocol` is what the fuzz tests take as a parameter: its path, a strategy
for its bodies (well-formed at first, then `mutated`: keys dropped, values of
the wrong type), and where its system prompt is (the billing rule may remove a
line there, nowhere else). Adding one is a body strategy and an entry in
`PROTOCOLS`; whether the proxy's rules apply to it follows `request_shape.api_for`
(a path it does not know must pass byte for byte).

`wire_requests(protocol)` turns a body into what a client sends: compact,
indented or ASCII-escaped JSON, perhaps with one defect the proxy must not
read past (invalid UTF-8, a key twice, nesting past `MAX_NESTING`, NaN, a
number out of range, cut short, a JSON array, nothing at all, a byte-order
mark, a content type that is not JSON, a content-encoding it cannot undo),
gzip-, deflate- or br-encoded, perhaps chunked. `defect` says which, so the
tests know what the proxy must do without asking the proxy's own parser.
"""

from __future__ import annotations

import copy
import gzip
import json
import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import brotli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stable_prefix.addons.request_body import MAX_NESTING
from stable_prefix.addons.request_shape import api_for

# --- text ---------------------------------------------------------------------------------------

LONE_SURROGATE = "\ud83d"  # the first half of an emoji, cut: valid JSON as an escape, no UTF-8 form

_hex = st.text("0123456789abcdef", min_size=5, max_size=5)


@st.composite
def billing_lines(draw) -> str:
    """Claude Code's billing header line, with the fields newer releases add (cc_prev_req, cc_prompt_id, cc_is_subagent)."""
    fields = {"cc_version": f"2.1.{draw(st.integers(100, 400))}.{draw(_hex)[:3]}", "cc_entrypoint": draw(st.sampled_from(["cli", "sdk-ts"]))}
    if draw(st.booleans()):
        fields["cch"] = draw(_hex)
    if draw(st.booleans()):
        fields["cc_prev_req"] = "req_" + draw(st.text("ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz0123456789", min_size=12, max_size=24))
    if draw(st.booleans()):
        fields["cc_prompt_id"] = draw(st.uuids()).hex
    if draw(st.booleans()):
        fields["cc_is_subagent"] = draw(st.sampled_from(["true", "false"]))
    order = draw(st.permutations(list(fields)))
    lead = draw(st.sampled_from(["", " ", "\t"]))
    name = draw(st.sampled_from(["x-anthropic-billing-header", "X-Anthropic-Billing-Header"]))
    return f"{lead}{name}: " + " ".join(f"{key}={fields[key]};" for key in order)


WORDS = [
    "read", "the", "file", "src/app.py", "def handler(request):", "    return 1", "<system-reminder>", "</system-reminder>",
    "gitStatus: Current branch: main", "Status:", "M src/app.py", "Today's date is 2026-12-01.", "Working directory: /home/dev",
    "mentions x-anthropic-billing-header: in passing", "💥", "日本語のテキスト", "naïve café", "tab\there", "{\"json\": [1, 2]}",
    f"cut {LONE_SURROGATE} emoji", "\udc00 low half", "\x00nul", "\x1b[31mred\x1b[0m", "\u2028line separator", "\x85next line",
]
# Lines that open opencode's, Qwen Code's and Pi's conversation context (rules/conversation_context.py): in a
# system prompt the rule moves them, and what follows up to the next one, into the first user message.
CONTEXT_LINES = ["Today's date: Tue Dec 01 2026", "Git snapshot at conversation start (it may be stale):", "# auto memory",
                 "Current date: 2026-12-01", "Current working directory: /home/dev/project"]
# The reminders an agent puts on a user message that the rules move (rules/turn_reminders.py,
# rules/conversation_context.py: STARTUP_CONTEXT), as whole text parts; the words after each opening are ours.
AGENT_REMINDER_OPENINGS = [
    "The current date is: Tuesday, December 1, 2026.", "# Plan Mode\nRead and plan; change nothing.",
    "Your operational mode has changed from plan to build.", "This is the Qwen Code. We are setting up the context for our chat.",
]
_line = st.one_of(
    st.lists(st.sampled_from(WORDS), max_size=5).map(" ".join),
    st.text(st.characters(exclude_categories=()), max_size=24),
    billing_lines(),
    st.sampled_from(CONTEXT_LINES),
)


@st.composite
def agent_reminders(draw) -> str:
    """A `<system-reminder>` text part of the kind the turn-reminder and conversation-context rules move."""
    opening, more = draw(st.sampled_from(AGENT_REMINDER_OPENINGS)), draw(texts())
    return f"<system-reminder>\n{opening}\n{more}\n</system-reminder>" + draw(st.sampled_from(["", "\n"]))


@st.composite
def texts(draw) -> str:
    """Lines of text: words, any characters (lone surrogates too), billing lines among them; \\n or \\r\\n."""
    lines = draw(st.lists(_line, max_size=5))
    return draw(st.sampled_from(["\n", "\r\n"])).join(lines)


TOOL_NAMES = ["Read", "Bash", "Edit", "WebFetch", "mcp__docs__search", "ToolSearch"]
_names = st.sampled_from(TOOL_NAMES)
_schemas = st.fixed_dictionaries(
    {"type": st.just("object"), "properties": st.dictionaries(st.sampled_from(["path", "command", "query"]), st.fixed_dictionaries(
        {"type": st.sampled_from(["string", "integer"])}, optional={"description": texts()}), max_size=2)},
    optional={"required": st.lists(st.sampled_from(["path", "command"]), max_size=1, unique=True)},
)
_ids = st.text("0123456789abcdefABCDEF", min_size=6, max_size=12)
_small_json = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False) | texts(),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=6,
)


def _with_cache_control(block: dict) -> st.SearchStrategy[dict]:
    return st.sampled_from([block, {**block, "cache_control": {"type": "ephemeral"}}])


# --- Anthropic /v1/messages ---------------------------------------------------------------------

_a_text = st.builds(lambda text: {"type": "text", "text": text}, texts()).flatmap(_with_cache_control)
_a_reminder = st.builds(lambda text: {"type": "text", "text": text}, agent_reminders())
_a_tool_use = st.builds(lambda id_, name, args: {"type": "tool_use", "id": "toolu_" + id_, "name": name, "input": args},
                        _ids, _names, st.dictionaries(st.sampled_from(["path", "command"]), texts(), max_size=2))
_a_reference = st.builds(lambda name: {"type": "tool_reference", "tool_name": name}, _names)
_a_tool_result = st.builds(lambda id_, content: {"type": "tool_result", "tool_use_id": "toolu_" + id_, "content": content},
                           _ids, texts() | st.lists(_a_text | _a_reference, max_size=3))
_a_message = st.one_of(
    st.builds(lambda content: {"role": "user", "content": content},
              texts() | st.lists(_a_text | _a_tool_result | _a_reminder, min_size=1, max_size=3)),
    st.builds(lambda content: {"role": "assistant", "content": content}, texts() | st.lists(_a_text | _a_tool_use, min_size=1, max_size=3)),
    st.builds(lambda content: {"role": "system", "content": content}, texts() | st.just([]) | st.lists(_a_text, max_size=2)),
)
_a_tool = st.builds(lambda name, description, schema: {"name": name, "description": description, "input_schema": schema},
                    _names, texts(), _schemas).flatmap(lambda tool: st.sampled_from([tool, {**tool, "defer_loading": True}]))

anthropic_bodies = st.fixed_dictionaries(
    {"model": st.sampled_from(["claude-opus-4-8", "claude-haiku-4-5"]), "messages": st.lists(_a_message, max_size=6)},
    optional={
        "max_tokens": st.integers(1, 64000),
        "system": texts() | st.lists(_a_text, max_size=3),
        "tools": st.lists(_a_tool, max_size=4, unique_by=lambda tool: tool["name"]),
        "stream": st.booleans(),
        "temperature": st.floats(0, 1),
        "metadata": st.fixed_dictionaries({"user_id": _ids}),
    },
)


def anthropic_system_texts(body: dict) -> list[str]:
    system = body.get("system")
    if isinstance(system, str):
        return [system]
    if isinstance(system, list):
        return [block["text"] for block in system if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str)]
    return []


# --- OpenAI /v1/chat/completions ----------------------------------------------------------------

_o_text = st.builds(lambda text: {"type": "text", "text": text}, texts())
_o_reminder = st.builds(lambda text: {"type": "text", "text": text}, agent_reminders())
_o_call = st.builds(lambda id_, name, args: {"id": "call_" + id_, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}},
                    _ids, _names, st.dictionaries(st.sampled_from(["path", "command"]), st.text(max_size=12), max_size=2))
# claude-code-router sends a tool result as the JSON text of its blocks (a ToolSearch load among them).
_o_tool_content = texts() | st.lists(_a_text | _a_reference, min_size=1, max_size=3).map(json.dumps)
_o_message = st.one_of(
    st.builds(lambda role, content: {"role": role, "content": content}, st.sampled_from(["system", "developer"]),
              texts() | st.lists(_o_text, min_size=1, max_size=2)),
    st.builds(lambda content: {"role": "user", "content": content}, texts() | st.lists(_o_text | _o_reminder, min_size=1, max_size=3)),
    st.builds(lambda content, calls: {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})},
              st.none() | texts(), st.lists(_o_call, max_size=2)),
    st.builds(lambda id_, content: {"role": "tool", "tool_call_id": "call_" + id_, "content": content}, _ids, _o_tool_content),
)
_o_tool = st.builds(lambda name, description, schema: {"type": "function", "function": {"name": name, "description": description, "parameters": schema}},
                    _names, texts(), _schemas)

openai_bodies = st.fixed_dictionaries(
    {"model": st.sampled_from(["claude-opus-4-8", "gpt-5"]), "messages": st.lists(_o_message, max_size=6)},
    optional={
        "max_tokens": st.integers(1, 64000),
        "max_completion_tokens": st.integers(1, 64000),
        "tools": st.lists(_o_tool, max_size=4, unique_by=lambda tool: tool["function"]["name"]),
        "stream": st.booleans(),
        "stream_options": st.just({"include_usage": True}),
        "temperature": st.floats(0, 2),
    },
)


def _leading_system_texts(messages: Any, roles: tuple[str, ...] = ("system", "developer")) -> list[str]:
    texts_found: list[str] = []
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, dict) or message.get("role") not in roles:
            break
        content = message.get("content")
        if isinstance(content, str):
            texts_found.append(content)
        elif isinstance(content, list):
            texts_found += [part["text"] for part in content if isinstance(part, dict) and part.get("type") in ("text", "input_text")
                            and isinstance(part.get("text"), str)]
    return texts_found


def openai_system_texts(body: dict) -> list[str]:
    return _leading_system_texts(body.get("messages"))


# --- OpenAI /v1/responses (the Responses API) --------------------------------------------------

_r_text = st.builds(lambda text: {"type": "input_text", "text": text}, texts())
_r_reminder = st.builds(lambda text: {"type": "input_text", "text": text}, agent_reminders())
_r_item = st.one_of(
    st.builds(lambda role, content: {"type": "message", "role": role, "content": content},
              st.sampled_from(["user", "developer", "system", "assistant"]), texts() | st.lists(_r_text | _r_reminder, min_size=1, max_size=3)),
    st.builds(lambda id_, name, args: {"type": "function_call", "call_id": "call_" + id_, "name": name, "arguments": json.dumps(args)},
              _ids, _names, st.dictionaries(st.sampled_from(["path", "command"]), st.text(max_size=12), max_size=2)),
    st.builds(lambda id_, output: {"type": "function_call_output", "call_id": "call_" + id_, "output": output}, _ids, texts()),
)
_r_tool = st.builds(lambda name, description, schema: {"type": "function", "name": name, "description": description, "parameters": schema},
                    _names, texts(), _schemas)

responses_bodies = st.fixed_dictionaries(
    {"model": st.sampled_from(["gpt-5-codex", "claude-opus-4-8"]), "input": texts() | st.lists(_r_item, max_size=6)},
    optional={
        "instructions": texts(),
        "tools": st.lists(_r_tool, max_size=4, unique_by=lambda tool: tool["name"]),
        "stream": st.booleans(),
        "max_output_tokens": st.integers(1, 64000),
        "previous_response_id": _ids.map(lambda id_: "resp_" + id_),
        "store": st.booleans(),
    },
)


def responses_system_texts(body: dict) -> list[str]:
    instructions = [body["instructions"]] if isinstance(body.get("instructions"), str) else []
    return instructions + _leading_system_texts(body.get("input"))


# --- protocols ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Protocol:
    name: str
    path: str
    bodies: st.SearchStrategy[dict]
    system_texts: Callable[[dict], list[str]]  # where the billing rule may remove a line

    @property
    def normalized(self) -> bool:
        """Whether the proxy's rules apply (else every body must pass byte for byte, unlogged)."""
        return api_for("POST", self.path) is not None


PROTOCOLS = {
    "anthropic": Protocol("anthropic", "/v1/messages?beta=true", anthropic_bodies, anthropic_system_texts),
    "openai": Protocol("openai", "/v1/chat/completions", openai_bodies, openai_system_texts),
    "responses": Protocol("responses", "/v1/responses", responses_bodies, responses_system_texts),
}


# --- missing fields and wrong types ------------------------------------------------------------


def _places(value: Any, found: list) -> list:
    """Every (container, key) in `value`, depth first."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        found.append((value, key))
        _places(child, found)
    return found


@st.composite
def mutated(draw, bodies: st.SearchStrategy[dict]) -> dict:
    """A body with up to three of: a key dropped, a value replaced by one of another type."""
    body = copy.deepcopy(draw(bodies))
    for _ in range(draw(st.integers(0, 3))):
        places = _places(body, [])
        if not places:
            break
        container, key = places[draw(st.integers(0, len(places) - 1))]
        if isinstance(container, dict) and draw(st.booleans()):
            del container[key]
        else:
            container[key] = draw(_small_json)
    return body


# --- on the wire --------------------------------------------------------------------------------


def client_json(body: Any, style: str) -> bytes:
    """JSON as clients write it: a lone surrogate as its escape (JSON.stringify does so)."""
    if style == "ascii":
        return json.dumps(body).encode()
    text = json.dumps(body, ensure_ascii=False, indent=2 if style == "indented" else None, separators=None if style == "indented" else (",", ":"))
    return text.encode("utf-8", "backslashreplace")


def _after_first_brace(data: bytes, insert: bytes) -> bytes:
    return data[:1] + insert + (b"," if data[1:].lstrip()[:1] != b"}" else b"") + data[1:]


def _first_quote_inside(data: bytes, insert: bytes) -> bytes:
    at = data.find(b'"', 1)
    return data[: at + 1] + insert + data[at + 1 :] if at > 0 else data + insert


DEFECTS: dict[str, Callable[[bytes, dict], bytes | None]] = {
    "not UTF-8 (latin-1)": lambda data, body: _first_quote_inside(data, b"caf\xe9"),
    "not UTF-8 (a surrogate's raw bytes)": lambda data, body: _first_quote_inside(data, b"\xed\xa0\xbd"),
    "a key twice": lambda data, body: _after_first_brace(data, json.dumps(next(iter(body))).encode() + b":null") if body else None,
    f"nested {MAX_NESTING + 1} deep": lambda data, body: _after_first_brace(data, b'"deep":' + b"[" * MAX_NESTING + b"]" * MAX_NESTING),
    "nested 100,000 deep": lambda data, body: _after_first_brace(data, b'"deep":' + b"[" * 100_000 + b"]" * 100_000),
    "NaN": lambda data, body: _after_first_brace(data, b'"top_p":NaN'),
    "a number out of range": lambda data, body: _after_first_brace(data, b'"top_p":1e999'),
    "cut short": lambda data, body: data[: len(data) // 2],
    "a JSON array": lambda data, body: b"[" + data + b"]",
    "empty": lambda data, body: b"",
    "a byte-order mark": lambda data, body: b"\xef\xbb\xbf" + data,
}
JSON_CONTENT_TYPES = ["application/json", "application/json; charset=utf-8", None]
OTHER_CONTENT_TYPES = ["text/plain", "text/plain; charset=utf-8", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"]
ENCODINGS: dict[str, Callable[[bytes], bytes]] = {
    "identity": lambda data: data,
    "gzip": gzip.compress,
    "deflate": zlib.compress,
    "br": brotli.compress,
}
BAD_ENCODINGS: dict[str, Callable[[bytes], bytes]] = {
    "x-custom": lambda data: data,  # a content-encoding nobody knows
    "gzip": lambda data: b"\x1f\x8b not gzip inside",  # says gzip, is not
}


def _one_in(n: int) -> st.SearchStrategy[bool]:
    # Not integers(0, n - 1) == 0: Hypothesis favours boundary values, which would make most examples defects.
    return st.sampled_from([False] * (n - 1) + [True])


@dataclass(frozen=True)
class WireRequest:
    protocol: Protocol
    content: bytes  # as sent, content-encoding applied
    headers: tuple[tuple[str, str], ...]
    chunked: bool
    defect: str | None  # why the proxy must not read it; None: it must
    body: dict  # the body before serialization and defects

    def header(self, name: str) -> str | None:
        return next((value for key, value in self.headers if key == name), None)


@st.composite
def wire_requests(draw, protocol: Protocol, defects: bool = True) -> WireRequest:
    body = draw(mutated(protocol.bodies))
    data = client_json(body, draw(st.sampled_from(["compact", "compact", "indented", "ascii"])))
    defect = None
    if defects and draw(_one_in(4)):
        name = draw(st.sampled_from(sorted(DEFECTS)))
        damaged = DEFECTS[name](data, body)
        if damaged is not None:
            data, defect = damaged, name
    if defects and draw(_one_in(10)):
        content_type = draw(st.sampled_from(OTHER_CONTENT_TYPES))
        defect = defect or f"content-type {content_type}"
    else:
        content_type = draw(st.sampled_from(JSON_CONTENT_TYPES))
    if defects and draw(_one_in(20)):
        encoding = draw(st.sampled_from(sorted(BAD_ENCODINGS)))
        content = BAD_ENCODINGS[encoding](data)
        defect = defect or f"content-encoding {encoding} that does not decode"
    else:
        encoding = draw(st.sampled_from(sorted(ENCODINGS)))
        content = ENCODINGS[encoding](data)
    headers = [("x-api-key", "sk-fuzz")]
    if content_type:
        headers.append(("content-type", content_type))
    if encoding != "identity":
        headers.append(("content-encoding", encoding))
    return WireRequest(protocol, content, tuple(headers), draw(st.booleans()), defect, body)


# --- running them -------------------------------------------------------------------------------

# FUZZ_SCALE=20: twenty times the examples (the soak's run).
SCALE = float(os.environ.get("FUZZ_SCALE", "1"))
FUZZ_SETTINGS = dict(
    deadline=None,  # a shared CPU: timings mean nothing
    database=None,  # no example database: a failure prints the line that replays it
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def fuzz(protocol: Protocol, examples: int, check: Callable[[WireRequest], None]) -> None:
    """`check` each of `examples` (times FUZZ_SCALE) generated requests of `protocol`."""

    @settings(max_examples=int(examples * SCALE), **FUZZ_SETTINGS)
    @given(wire_requests(protocol))
    def each(wire: WireRequest) -> None:
        check(wire)

    each()
