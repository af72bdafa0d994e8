"""Lanes: which requests of a session belong together.

Claude Code interleaves several conversations over one connection: the main
agent, each sub-agent type (its own system prompt and a subset of the tools),
and side requests such as the conversation title (no tools, a short system
prompt of its own). A prefix cache sees each as its own line of prompts, so a
sub-agent call must not count as a break of the main lane.

A lane is identified by its signature: the sorted tool names and the opening
(first `OPENING_CHARS` characters) of each system text piece, with billing
and date lines left out. The opening is what a `/clear` leaves unchanged (the
git status it refreshes sits at the end of the long instruction block), so a
new conversation of the same agent stays in its lane, and its break shows.

Names, assigned in order of first appearance:
  main          requests with tools that can start sub-agents (`Task`/`Agent`),
                or the first lane with tools when none can; `main-<hash>` for
                a second such signature (e.g. after an MCP server added tools)
  sub:<hash>    other requests with tools; the billing header's
                `cc_is_subagent=true`, when present, also says so
  side:title    requests without tools that ask for a title (a `title` field
                in their output schema, or the word in their system prompt)
  side:<hash>   other requests without tools
<hash> is the first 6 hex digits of the signature's SHA-256, so a lane keeps
its name across sessions as long as its tools and prompt opening do.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from stable_prefix.addons.normalize import Api, is_billing_line, is_date_line, system_texts, tool_names
from stable_prefix.addons.prompt_order import canonical_json, canonical_value

OPENING_CHARS = 256
AGENT_TOOLS = frozenset({"Task", "Agent"})
_SUBAGENT_FIELD = re.compile(r"\bcc_is_subagent=true\b")
_TITLE = re.compile(r"\btitle\b", re.IGNORECASE)


@dataclass(frozen=True)
class LaneSignature:
    tools: tuple[str, ...]  # sorted
    opening: str
    # Hints for naming only, not identity:
    says_subagent: bool = False  # from the billing header, when the body still has it
    asks_for_title: bool = False  # its structured-output schema has a `title` field

    @property
    def identity(self) -> LaneSignature:
        return LaneSignature(self.tools, self.opening)

    @property
    def digest(self) -> str:
        material = "\x1f".join(self.tools) + "\x1e" + self.opening
        return hashlib.sha256(material.encode("utf-8", "surrogatepass")).hexdigest()[:6]

    @property
    def can_start_subagents(self) -> bool:
        return bool(AGENT_TOOLS & set(self.tools))


def lane_signature(body: dict, api: Api) -> LaneSignature:
    openings = []
    says_subagent = False
    for text in system_texts(body, api):
        if "cc_is_subagent=true" in text:
            says_subagent = says_subagent or any(is_billing_line(line) and _SUBAGENT_FIELD.search(line) for line in text.splitlines())
        kept, size = [], 0
        for line in text.splitlines():
            if size > OPENING_CHARS:
                break  # the rest of a long prompt is not looked at
            if not (is_billing_line(line) or is_date_line(line)):
                kept.append(line)
                size += len(line) + 1
        if kept:
            openings.append("\n".join(kept)[:OPENING_CHARS])
    return LaneSignature(tuple(sorted(tool_names(body))), "\x1d".join(openings), says_subagent, "title" in _output_schema_fields(body))


def routing_key(body: dict, api: Api) -> str:
    """A key for the lane's stable head, for routers that keep one key on one replica.

    The head is what every request of a conversation repeats from the start: the
    whole system text and the tool definitions, as the model reads them
    (`cache_control` markers left out). Taken from the body as forwarded, after
    the rules, so the rotating billing header does not change it. Unlike a lane's
    name it covers all of the system text, the user's environment section
    included: two users or two projects get different keys, and a router can
    spread them over its replicas while each lane stays where its cache is.
    """
    head = [system_texts(body, api), canonical_value(body.get("tools") or [])]
    return hashlib.sha256(canonical_json(head)).hexdigest()[:32]


def _output_schema_fields(body: dict) -> set[str]:
    """Property names of a requested JSON output: Claude Code's title request
    sets `output_config.format` (Anthropic), OpenAI clients `response_format`."""
    fields: set[str] = set()
    config = body.get("output_config")
    for holder in (config.get("format") if isinstance(config, dict) else None, body.get("response_format")):
        if not isinstance(holder, dict):
            continue
        nested = holder.get("json_schema")
        for schema in (holder.get("schema"), nested.get("schema") if isinstance(nested, dict) else None):
            if isinstance(schema, dict) and isinstance(schema.get("properties"), dict):
                fields |= set(schema["properties"])
    return fields


class LaneNames:
    """Gives each signature a stable, readable name (see the module docstring)."""

    def __init__(self) -> None:
        self._names: dict[LaneSignature, str] = {}

    def name_for(self, signature: LaneSignature) -> str:
        # Hints are not part of identity: the same agent may be seen with and
        # without its billing header (e.g. stripped captures).
        key = signature.identity
        if key not in self._names:
            self._names[key] = self._new_name(signature)
        return self._names[key]

    def _new_name(self, signature: LaneSignature) -> str:
        taken = set(self._names.values())
        if not signature.tools:
            name = "side:title" if signature.asks_for_title or _TITLE.search(signature.opening) else f"side:{signature.digest}"
        elif not signature.says_subagent and (signature.can_start_subagents or not any(n.startswith("main") for n in taken)):
            name = "main"
        else:
            name = f"sub:{signature.digest}"
        if name in taken:
            name = f"{name}-{signature.digest}"
        return name
