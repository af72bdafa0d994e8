"""Prompt order: the bytes of a request in the order a model reads them.

A prefix cache can reuse the beginning of a prompt only as far as its bytes
are unchanged, so "how stable is the prefix" must be measured in the order the
prompt is rendered, not in the order JSON keys happen to be sent:

  1. the system text: the `system` string or each `system` text block
     (Anthropic), the leading system messages (OpenAI), `instructions`
     (Responses), then any `role:system` (or `developer`) message found inside
     `messages` or `input`, because vllm-mlx hoists those to the front (that is
     the very break the system_messages rule removes);
  2. the tool definitions, in the order given;
  3. the other messages (Responses: input items), in order. A Responses
     request that continues a stored response names it first
     (`previous_response_id`): the server puts that response's history there,
     which the request does not hold (the proxy resolves it when it saw that
     response, `response_chains.py`).

Each piece is a `Segment` with its JSON path in the request body. Segments are
serialized deterministically (canonical JSON: sorted keys, no spaces, UTF-8),
each followed by a newline, as the model reads them (`canonical_value`): every
`cache_control` marker left out, and a content list of one plain text block
taken as its text. Claude Code moves the marker to the newest turn every time,
and flattens the message it leaves; neither changes what the model reads.
Responses items are read without their `id` and `status`
(`responses_input.rendered`): Codex gives the same instructions a new id in
every conversation, and no server renders it.

The diagnosis and the captures CLI both compare two requests with `compare()`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from stable_prefix.addons import responses_input
from stable_prefix.addons.request_shape import Api, tool_name
from stable_prefix.addons.responses_input import TEXT_PART_TYPES

SEGMENT_END = b"\n"


@dataclass(frozen=True)
class Segment:
    path: str  # e.g. "system[0]", "tools[3]", "messages[12]"
    value: Any  # the JSON value, cache_control removed
    data: bytes  # its serialization, SEGMENT_END included


@dataclass(frozen=True)
class PromptOrder:
    segments: tuple[Segment, ...]

    @property
    def total_bytes(self) -> int:
        return sum(len(segment.data) for segment in self.segments)

    def to_bytes(self) -> bytes:
        return b"".join(segment.data for segment in self.segments)


@dataclass(frozen=True)
class Divergence:
    path: str  # deepest JSON path (in the current body) where the two first differ
    byte_offset: int  # offset of the first differing byte in prompt order
    segment_index: int  # which segment of the current order (may equal its length: "ran out")
    offset_in_segment: int

    def to_json(self) -> dict:
        return {"path": self.path, "byte_offset": self.byte_offset}


@dataclass(frozen=True)
class Comparison:
    """The current request against the previous one."""

    stable_prefix_bytes: int  # bytes both share from the start
    total_bytes: int  # of the current request
    previous_total_bytes: int
    first_divergence: Divergence | None  # None: the two are identical

    @property
    def prefix_kept(self) -> bool:
        """All of the previous prompt is a prefix of this one: a cache holding
        the previous request can be reused in full."""
        return self.stable_prefix_bytes == self.previous_total_bytes

    @property
    def stable_prefix_ratio(self) -> float:
        return self.stable_prefix_bytes / self.total_bytes if self.total_bytes else 1.0


def canonical_value(value: Any) -> Any:
    """The value as the model reads it: `cache_control` markers dropped, and a
    `content` list holding one plain text block read as that text. Claude Code
    sends the newest message as `[{"type":"text","text":T,"cache_control":...}]`
    and the same message on the next turn as the string T; a chat template
    renders both alike, so they must compare equal."""
    # Scalars are returned in place, not recursed into: this runs over every
    # byte of every request, so the call count matters.
    if isinstance(value, dict):
        result = {}
        for key, item in value.items():
            if key == "cache_control":
                continue
            if isinstance(item, (dict, list)):
                item = canonical_value(item)
                if key == "content" and isinstance(item, list) and len(item) == 1 and _is_plain_text_block(item[0]):
                    item = item[0]["text"]
            result[key] = item
        return result
    if isinstance(value, list):
        return [canonical_value(item) if isinstance(item, (dict, list)) else item for item in value]
    return value


def _is_plain_text_block(item: Any) -> bool:
    return isinstance(item, dict) and item.keys() == {"type", "text"} and item["type"] in TEXT_PART_TYPES and isinstance(item["text"], str)


_CANONICAL = json.JSONEncoder(sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def canonical_json(value: Any) -> bytes:
    return _CANONICAL.encode(value).encode("utf-8", "surrogatepass")


def _system_text(value: Any) -> str | None:
    """The text of a system-prompt piece: a string, a text block, or a system
    message whose content is a string or text parts. None for other shapes."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and value.get("type") == "text" and isinstance(value.get("text"), str):
        return value["text"]
    if isinstance(value, dict) and "role" in value:
        content = value.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list) and all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in content):
            return "\n".join(part["text"] for part in content)
    return None


def _segment(path: str, value: Any, *, system: bool = False) -> Segment:
    value = canonical_value(value)
    text = _system_text(value) if system else None
    # System text is read as text (so a divergence can be traced to a line);
    # everything else as canonical JSON.
    data = text.encode("utf-8", "surrogatepass") if text is not None else canonical_json(value)
    return Segment(path, value, data + SEGMENT_END)


def _is_system_message(message: Any) -> bool:
    return isinstance(message, dict) and message.get("role") in ("system", "developer")


def prompt_order(body: dict, api: Api, reuse: dict[str, Segment] | None = None) -> PromptOrder:
    """`reuse`: segments already serialized for this very body (by path),
    known not to have changed since; the proxy passes the client's order
    minus what the rules touched, which halves the diagnosis cost."""
    reuse = reuse or {}

    def segment(path: str, value: Any, system: bool = False) -> Segment:
        return reuse.get(path) or _segment(path, value, system=system)

    if api == "responses":
        return _responses_prompt_order(body, segment)
    system: list[Segment] = []
    if api == "anthropic":
        value = body.get("system")
        if isinstance(value, str):
            system.append(segment("system", value, system=True))
        elif isinstance(value, list):
            system += [segment(f"system[{index}]", block, system=True) for index, block in enumerate(value)]
    messages = body.get("messages") if isinstance(body.get("messages"), list) else []
    system += [segment(f"messages[{i}]", m, system=True) for i, m in enumerate(messages) if _is_system_message(m)]
    tools = body.get("tools") if isinstance(body.get("tools"), list) else []
    tool_segments = [segment(f"tools[{index}]", tool) for index, tool in enumerate(tools)]
    conversation = [segment(f"messages[{i}]", m) for i, m in enumerate(messages) if not _is_system_message(m)]
    return PromptOrder(tuple(system + tool_segments + conversation))


def _responses_prompt_order(body: dict, segment) -> PromptOrder:
    """`instructions` and every developer/system item (vllm-mlx merges them
    into one system message in front), the tools, then the other items; an
    input string is one user message. Empty instructions are not rendered."""
    system: list[Segment] = []
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        system.append(segment("instructions", body["instructions"], system=True))
    items = responses_input.items(body) or []
    system += [segment(f"input[{i}]", responses_input.rendered(item), system=True) for i, item in enumerate(items) if responses_input.is_system_message(item)]
    tools = body.get("tools") if isinstance(body.get("tools"), list) else []
    tool_segments = [segment(f"tools[{index}]", tool) for index, tool in enumerate(tools)]
    conversation = []
    if isinstance(body.get("previous_response_id"), str):
        conversation.append(segment("previous_response_id", body["previous_response_id"]))
    if isinstance(body.get("input"), str):  # read as the user message it is, as when a later request holds it as an item
        conversation.append(segment("input", responses_input.as_items(body["input"])[0]))
    conversation += [segment(f"input[{i}]", responses_input.rendered(item)) for i, item in enumerate(items) if not responses_input.is_system_message(item)]
    return PromptOrder(tuple(system + tool_segments + conversation))


def _common_prefix_length(a: bytes, b: bytes) -> int:
    """Binary search on slice equality: C-speed compares, log(n) of them."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def compare(previous: PromptOrder, current: PromptOrder) -> Comparison:
    stable = 0
    divergence = None
    for index, segment in enumerate(current.segments):
        before = previous.segments[index] if index < len(previous.segments) else None
        if before is not None and before.data == segment.data:
            stable += len(segment.data)
            continue
        if before is None:
            divergence = Divergence(segment.path, stable, index, 0)
        else:
            shared = _common_prefix_length(before.data, segment.data)
            path = _deepest_difference(segment.path, before.value, segment.value)
            divergence = Divergence(path, stable + shared, index, shared)
            stable += shared
        break
    else:
        if len(previous.segments) > len(current.segments):  # the current one is shorter
            index = len(current.segments)
            divergence = Divergence(previous.segments[index].path, stable, index, 0)
    return Comparison(stable, current.total_bytes, previous.total_bytes, divergence)


def path_index(path: str) -> int:
    """`messages[12].content` -> 12."""
    return int(path[path.index("[") + 1 : path.index("]")])


def message_index(segment: Segment) -> int | None:
    """The index of a message (Responses: input item) segment, else None."""
    return path_index(segment.path) if segment.path.startswith(("messages[", "input[")) else None


def is_system_text(segment: Segment) -> bool:
    """A segment of the system text: the system prompt, or a system (developer) message the server hoists."""
    # A message may be any JSON value in a body a client got wrong: only a dict has a role.
    value = segment.value
    return segment.path.startswith(("system", "instructions")) or (isinstance(value, dict) and value.get("role") in responses_input.SYSTEM_ROLES)


def tool_names(order: PromptOrder) -> list[str]:
    """The names of a prompt's tools, in their order."""
    return [tool_name(segment.value) for segment in order.segments if segment.path.startswith("tools[")]


def as_body(order: PromptOrder) -> dict:
    """The tools and messages of a prompt order, as a body (canonical values)."""
    tools = [s.value for s in order.segments if s.path.startswith("tools[")]
    messages = [s.value for s in sorted((s for s in order.segments if s.path.startswith("messages[")), key=lambda s: path_index(s.path))]
    return {"tools": tools, "messages": messages}


def line_at(segment: Segment, offset: int) -> str:
    """The text line of a segment that holds byte `offset`."""
    start = segment.data.rfind(b"\n", 0, offset) + 1
    end = segment.data.find(b"\n", offset)
    return segment.data[start : end if end >= 0 else len(segment.data)].decode("utf-8", "replace")


def _deepest_difference(path: str, before: Any, after: Any) -> str:
    """Walk into both values to the first place they differ, keys in sorted
    order as serialized: `messages[12]` -> `messages[12].content[0].text`."""
    while True:
        if isinstance(before, dict) and isinstance(after, dict):
            for key in sorted(set(before) | set(after)):
                if before.get(key, _MISSING) != after.get(key, _MISSING):
                    if key not in before or key not in after:
                        return f"{path}.{key}"
                    path, before, after = f"{path}.{key}", before[key], after[key]
                    break
            else:
                return path
        elif isinstance(before, list) and isinstance(after, list):
            for index in range(max(len(before), len(after))):
                if index >= len(before) or index >= len(after):
                    return f"{path}[{index}]"
                if before[index] != after[index]:
                    path, before, after = f"{path}[{index}]", before[index], after[index]
                    break
            else:
                return path
        else:
            return path


_MISSING = object()

