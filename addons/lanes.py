"""Lanes: which requests of a session belong together.

Claude Code interleaves several conversations over one connection: the main
agent, each sub-agent type (its own system prompt and a subset of the tools),
and side requests such as the conversation title (no tools, a short system
prompt of its own). A prefix cache sees each as its own line of prompts, so a
sub-agent call must not count as a break of the main lane.

A lane is identified by its signature: the sorted tool names (deferred tools
that ToolSearch loads mid-conversation left out, and tools a late tool change
adds) and the opening (first
`OPENING_CHARS` characters) of each system text piece, with every rule's
subject left out, whether the rule is on or not (`rules.without_subjects`,
`rules.is_subject_line`: billing and date lines, a git status paragraph,
conversation context). The opening is what a `/clear`
leaves unchanged, so a new conversation of the same agent stays in its lane,
and its break shows. A subagent instance (instances of one type run
concurrently) gets a lane of its own, `<type lane>@<instance>`, grouped under
its type's lane for reporting.

Each agent says who it is in its own way (`AGENTS`, told apart by User-Agent; the facts are each agent's
record's `lanes`, `stable_prefix/agents/<agent>.py`):
  Claude Code  starts subagents with `Task`/`Agent`; a subagent's requests
               carry `x-claude-code-agent-id` (the instance), every request
               `x-claude-code-session-id` (the conversation). With
               CLAUDE_CODE_GATEWAY_HINT_HEADERS=1 (what `stable-prefix
               claude` sets; first-party hosts may send them too) it says
               more (`ClaudeCodeHints`): `x-claude-code-agent-type` (the
               subagent's type, `fork` for a fork),
               `x-claude-code-request-class` (main, subagent, compaction,
               auxiliary, side_reply, workflow), `x-claude-code-compaction`
               on the summary request of /compact; besides, a subagent's
               subagent carries `x-claude-code-parent-agent-id`, and a
               remote session's auxiliary requests
               `x-claude-code-auxiliary-type`. Where it says, the names
               follow what it says; where it does not, the guesses below.
  opencode     starts them with `task`; every request carries `x-session-id`,
               a subagent's the child session's, with `x-parent-session-id`
  Qwen Code    starts them with `agent`; no header names anything, so an
               instance is named by its first prompt (its task)
  Pi           its User-Agent is the OpenAI JS SDK's (`OpenAI/JS 6.26.0`),
               any such client's; with the provider `stable-prefix pi`
               registers (`sendSessionAffinityHeaders`) every request carries
               `session_id` (its session: `--continue` keeps it), which tells
               it apart; it starts no subagents
  Codex CLI    every request carries `session-id` (the same for every turn of
               a `codex exec` and its `codex exec resume`, a new one per
               `codex exec`); no subagents reach a self-hosted server (its
               agents are a `namespace` tool, which vllm-mlx does not convert)
A request of any other client is read as Claude Code's. The diagnosis tells
a new conversation from a compaction by the conversation a request names.

Names, assigned in order of first appearance:
  main          requests with tools that can start sub-agents (`Task`/`Agent`),
                or the first lane with tools when none can; `main-<hash>` for
                a second such signature (e.g. after an MCP server added tools)
  sub:<hash>    other requests with tools; the billing header's
                `cc_is_subagent=true`, when present, also says so, and so
                does an agent id header
  sub:<hash>@<id>  one instance of that subagent type (first 8 characters of
                its agent id)
  sub:<type>    a subagent type the request names (`x-claude-code-agent-type`),
                `sub:<type>@<id>` its instances
  fork:<parent>@<id>  a fork subagent: it inherits its parent's whole
                conversation, so its signature is its parent's (system and
                tools); `<parent>` is its parent's lane (`main`, or the
                instance lane its parent-agent-id names). Told by its agent
                type `fork`, or, where no type is sent, by an agent id on a
                request whose signature is a main lane's
  side:<type>   a request its client calls auxiliary and names the type of
  side:title    requests without tools that ask for a title (a `title` field
                in their output schema, or the word in their system prompt)
  side:<hash>   other requests without tools
<hash> is the first 6 hex digits of the signature's SHA-256, so a lane keeps
its name across sessions as long as its tools and prompt opening do.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass

from stable_prefix.addons import rules
from stable_prefix.addons.prompt_order import canonical_json, canonical_value
from stable_prefix.addons.request_shape import Api, conversation, system_texts, tool_names
from stable_prefix.addons.rules.billing_header import is_billing_line
from stable_prefix.addons.rules.loaded_tools import deferred_tool_names
from stable_prefix.addons.rules.system_messages import late_tool_names
from stable_prefix.agents import claude_code, roster
from stable_prefix.agents.base import CodingAgent

OPENING_CHARS = 256
INSTANCE_CHARS = 8
# Claude Code's ids (its record's lane facts): the subagent instance, the conversation.
AGENT_ID_HEADER = claude_code.AGENT_ID_HEADER
SESSION_ID_HEADER = claude_code.SESSION_ID_HEADER
# What Claude Code 2.1.332 says of a request beyond its ids (the module docstring says when).
PARENT_AGENT_ID_HEADER = "x-claude-code-parent-agent-id"
AGENT_TYPE_HEADER = "x-claude-code-agent-type"
AUXILIARY_TYPE_HEADER = "x-claude-code-auxiliary-type"
REQUEST_CLASS_HEADER = "x-claude-code-request-class"
COMPACTION_HEADER = "x-claude-code-compaction"  # `manual` or `auto`: the summary request of a compaction
CONTEXT_COMPACTED_HEADER = "x-claude-code-context-compacted"  # a request of a conversation just compacted
PROMPT_ID_HEADER = "x-claude-code-prompt-id"  # the user prompt a request serves (not used for lanes: one per turn)
FORK_AGENT_TYPE = "fork"
# A header value put into a lane name: a short word, nothing a log line or a file name would trip on.
_NAME_WORD = re.compile(r"[A-Za-z0-9_.:-]{1,40}")


# The agents whose requests the lanes tell apart, each by its record's `lanes` facts; a request of any other client
# (claude-code-router, the Agent SDK, the benchmark) is read as Claude Code's.
CLAUDE_CODE = roster.agent_keyed("claude")
OPENCODE = roster.agent_keyed("opencode")
QWEN_CODE = roster.agent_keyed("qwen")
CODEX = roster.agent_keyed("codex")
PI = roster.agent_keyed("pi")
AGENTS: tuple[CodingAgent, ...] = tuple(agent for agent in roster.AGENTS if agent.lanes is not None)
AGENT_TOOLS = frozenset().union(*(agent.lanes.subagent_tools for agent in AGENTS))
_SUBAGENT_FIELD = re.compile(r"\bcc_is_subagent=true\b")
_TITLE = re.compile(r"\btitle\b", re.IGNORECASE)


@dataclass(frozen=True)
class LaneSignature:
    tools: tuple[str, ...]  # sorted
    opening: str
    # Hints for naming only, not identity:
    says_subagent: bool = False  # from the billing header, when the body still has it
    asks_for_title: bool = False  # its structured-output schema has a `title` field
    instance: str | None = None  # the subagent instance's agent id, when the request names it
    agent_type: str | None = None  # the subagent type the request names (`fork` for a fork)
    parent_instance: str | None = None  # the instance of the agent that started this one, when named
    auxiliary_type: str | None = None  # what an auxiliary request is for, when the request names it

    @property
    def identity(self) -> LaneSignature:
        """The lane's type: what its name is made from (hints and instance aside)."""
        return LaneSignature(self.tools, self.opening)

    @property
    def digest(self) -> str:
        material = "\x1f".join(self.tools) + "\x1e" + self.opening
        return hashlib.sha256(material.encode("utf-8", "surrogatepass")).hexdigest()[:6]

    @property
    def can_start_subagents(self) -> bool:
        return bool(AGENT_TOOLS & set(self.tools))


def header(headers: Mapping[str, str] | None, name: str) -> str | None:
    """A request header, whatever the case of its name (capture records keep
    them lower-case; mitmproxy's Headers are case-insensitive)."""
    if not headers:
        return None
    value = headers.get(name)
    if value is None and isinstance(headers, dict):
        value = next((v for k, v in headers.items() if k.lower() == name), None)
    return value or None


def sent_by(agent: CodingAgent, headers: Mapping[str, str] | None) -> bool:
    """Whether a request with these headers is this agent's."""
    facts = agent.lanes
    user_agent = header(headers, "user-agent") or ""
    return user_agent.startswith(facts.user_agent) and (facts.identifying_header is None or header(headers, facts.identifying_header) is not None)


def agent_of(headers: Mapping[str, str] | None) -> CodingAgent:
    """The agent that sent a request, by its User-Agent; Claude Code for any other client
    (claude-code-router, the benchmark, a request without the header)."""
    return next((agent for agent in AGENTS if agent is not CLAUDE_CODE and sent_by(agent, headers)), CLAUDE_CODE)


def instance_of(agent: CodingAgent, headers: Mapping[str, str] | None) -> str | None:
    """The subagent instance a request's headers name (None for the main agent, side requests and agents that send none)."""
    facts = agent.lanes
    if facts.subagent_header is None or header(headers, facts.subagent_header) is None:
        return None
    return header(headers, facts.instance_header or facts.subagent_header)


def instance_name(agent: CodingAgent, instance_id: str) -> str:
    """A short name for an instance: Claude Code's agent ids are random hex, opencode's session
    ids start with their time (two instances started together share a long prefix)."""
    if not agent.lanes.random_ids:
        instance_id = hashlib.sha256(instance_id.encode("utf-8", "surrogatepass")).hexdigest()
    return instance_id[:INSTANCE_CHARS]


def session_of(headers: Mapping[str, str] | None) -> str | None:
    """The conversation a request belongs to, where its agent names it."""
    agent = agent_of(headers)
    return header(headers, agent.lanes.session_header) if agent.lanes.session_header else None


def lane_group(lane: str) -> str:
    """The type lane an instance lane belongs to (`sub:1a2b3c@ab12cd34` -> `sub:1a2b3c`)."""
    return lane.split("@", 1)[0]


def told_word(headers: Mapping[str, str] | None, name: str) -> str | None:
    """A header's value when it can go into a lane name as it is (a short word), else None."""
    value = header(headers, name)
    return value if value is not None and _NAME_WORD.fullmatch(value) else None


def told_compaction(headers: Mapping[str, str] | None) -> str | None:
    """What the client says of a compaction: `summary` for the request that writes the summary,
    `compacted` for one of a conversation just compacted, None when it says neither."""
    if header(headers, COMPACTION_HEADER) is not None or header(headers, REQUEST_CLASS_HEADER) == "compaction":
        return "summary"
    return "compacted" if header(headers, CONTEXT_COMPACTED_HEADER) is not None else None


def lane_signature(body: dict, api: Api, headers: Mapping[str, str] | None = None) -> LaneSignature:
    openings = []
    agent = agent_of(headers)
    agent_id = instance_of(agent, headers)
    says_subagent = agent_id is not None
    for text in system_texts(body, api):
        text = rules.without_subjects(text)  # a git status, a date, a working directory: not the lane
        if "cc_is_subagent=true" in text:
            says_subagent = says_subagent or any(is_billing_line(line) and _SUBAGENT_FIELD.search(line) for line in text.splitlines())
        kept, size = [], 0
        for line in text.splitlines():
            if size > OPENING_CHARS:
                break  # the rest of a long prompt is not looked at
            if not rules.is_subject_line(line):
                kept.append(line)
                size += len(line) + 1
        if kept:
            openings.append("\n".join(kept)[:OPENING_CHARS])
    deferred = deferred_tool_names(body, api) | late_tool_names(body, api)  # neither is what the conversation began with
    tools = tuple(sorted(name for name in tool_names(body) if name not in deferred))
    if agent_id is None and agent.lanes.instance_by_first_prompt and tools and not AGENT_TOOLS & set(tools):
        agent_id = first_prompt_digest(body)  # tools, but none to start subagents with: a subagent
        says_subagent = agent_id is not None
    instance = instance_name(agent, agent_id) if agent_id else None
    parent_id = header(headers, PARENT_AGENT_ID_HEADER) if agent is CLAUDE_CODE else None
    parent = instance_name(agent, parent_id) if parent_id else None
    return LaneSignature(tools, "\x1d".join(openings), says_subagent, "title" in _output_schema_fields(body), instance,
                         told_word(headers, AGENT_TYPE_HEADER), parent, told_word(headers, AUXILIARY_TYPE_HEADER))


def first_prompt_digest(body: dict) -> str | None:
    """A hash of the first user message's own words (its <system-reminder> blocks left
    out, which carry the date and the repository's state): a subagent's task."""
    for message in body.get("messages") or []:
        if isinstance(message, dict) and message.get("role") == "user":
            prompt = "\n".join(text for text in _texts(message.get("content")) if isinstance(text, str) and not text.startswith("<system-reminder>"))
            return hashlib.sha256(prompt.encode("utf-8", "surrogatepass")).hexdigest() if prompt else None
    return None


ROUTING_KEY_SCOPES = ("head", "lane")


def routing_key(body: dict, api: Api, headers: Mapping[str, str] | None = None, scope: str = "head") -> str:
    """A key for routers that keep one key on one replica (32 hex digits: ASCII, short, none of the user's text).

    scope `head`: the lane's stable head, what every request of a conversation
    repeats from the start: the whole system text, the tool definitions, and
    the messages of pure `<system-reminder>` context that lead the
    conversation (where the rules put Claude Code's environment), as the model
    reads them (`cache_control` markers left out). Taken from the body as
    forwarded, after the rules, so neither the rotating billing header nor a
    conversation's git status changes it. The environment (working directory)
    is in it: two projects get different keys, and a router can spread them
    over its replicas while each lane stays where its cache is. Instances of
    one subagent type share it (they share their head), so a fan-out's
    instances, and a new conversation, go where their head is cached.

    scope `lane`: the head and the subagent instance the request names
    (`lane_signature(...).instance`): each instance of a fan-out gets a key
    of its own, so a router spreads one user's concurrent subagents over the
    replicas (each then prefills the head once); the main agent's and side
    requests' keys are the head's.
    """
    if scope not in ROUTING_KEY_SCOPES:
        raise ValueError(f"routing key scope {scope!r}: not one of {', '.join(ROUTING_KEY_SCOPES)}")
    head = [system_texts(body, api), canonical_value(body.get("tools") or []), _leading_context(body, api)]
    if scope == "lane":
        instance = lane_signature(body, api, headers).instance
        if instance is not None:
            head.append({"instance": instance})
    return hashlib.sha256(canonical_json(head)).hexdigest()[:32]


def _leading_context(body: dict, api: Api) -> list:
    """The texts of the messages before the conversation proper: user messages
    whose every text is a `<system-reminder>`, up to the first other message.
    Texts, not the content as sent: Claude Code marks its newest message with
    `cache_control`, so on a conversation's first turn the environment message
    arrives as a marked block list and later as the same words (the key of a
    first turn and its second then differed, and a router moved the lane)."""
    leading = []
    for message in conversation(body, api) or []:
        if not isinstance(message, dict) or message.get("role") != "user":
            break
        content = message.get("content")
        texts = _texts(content)
        if not texts or not all(isinstance(text, str) and text.startswith("<system-reminder>") for text in texts):
            break
        leading.append(texts)  # the words only: a string and one text block read the same, a cache marker nothing
    return leading


def _texts(content) -> list:
    """The `text` of each block of a message's content (a string is its one text; another shape has none)."""
    if isinstance(content, str):
        return [content]
    return [block.get("text") for block in content if isinstance(block, dict)] if isinstance(content, list) else []


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


# How many subagent instances' names are remembered (least recently named first out): every instance is
# a new one, so a day of subagents would grow the map without end. An instance named again after it went
# gets the name its signature gives, the same unless its type lane's identity changed meanwhile; only a
# fork of a parent gone is named after its type lane. 4,096 is hours of subagents at ~200 B each.
MAX_NAMED_INSTANCES = 4096
# How many lane types' names (`_names`, `_told`: one per signature, ~1-2 KB each) are remembered. A type is per
# agent, version and project, not per instance, but a long life sees many: the least recently used go, the main
# agent's last. A type named again gets the name its signature gives (`sub:<hash>`, `side:<hash>`, the name
# the client told), the same as before unless another took it meanwhile.
MAX_LANE_TYPES = 1024


class LaneNames:
    """Gives each signature a stable, readable name (see the module docstring)."""

    def __init__(self, max_instances: int = MAX_NAMED_INSTANCES, max_types: int = MAX_LANE_TYPES) -> None:
        # Each least recently used first.
        self._names: dict[LaneSignature, str] = {}
        self._told: dict[tuple[str, str, LaneSignature], str] = {}  # (kind, type the client named, identity) -> lane
        self._instances: dict[str, str] = {}  # instance -> its lane, for a fork's parent
        self.max_instances, self.max_types = max_instances, max_types

    def name_for(self, signature: LaneSignature) -> str:
        if signature.auxiliary_type and not signature.tools:
            return self._told_name("side", signature.auxiliary_type, signature)
        # Hints are not part of identity: the same agent may be seen with and
        # without its billing header (e.g. stripped captures).
        key = signature.identity
        name = self._names[key] = self._names.pop(key, None) or self._new_name(signature)  # put back last
        _forget_oldest(self._names, self.max_types)
        if signature.instance is None:
            return name
        if self._is_fork(signature, name):
            parent = self._instances.get(signature.parent_instance or "", name)
            lane = f"fork:{parent}@{signature.instance}"
        elif signature.agent_type and signature.agent_type != FORK_AGENT_TYPE:
            lane = f"{self._told_name('sub', signature.agent_type, signature)}@{signature.instance}"
        else:
            lane = f"{name}@{signature.instance}"
        lane = self._instances[signature.instance] = self._instances.pop(signature.instance, lane)  # put back last
        _forget_oldest(self._instances, self.max_instances)
        return lane

    @staticmethod
    def _is_fork(signature: LaneSignature, name: str) -> bool:
        """What the client says (`fork`); else a guess: a subagent instance whose system and tools
        are a main lane's inherited its parent's whole prompt."""
        if signature.agent_type is not None:
            return signature.agent_type == FORK_AGENT_TYPE
        return name.startswith("main")

    def _told_name(self, kind: str, told: str, signature: LaneSignature) -> str:
        """`sub:<type>` / `side:<type>` for a type the client named; the same type with other
        tools or another prompt (another project's Explore) gets its signature's hash too."""
        key = (kind, told, signature.identity)
        if key not in self._told:
            name = f"{kind}:{told}"
            self._told[key] = name if name not in self._told.values() else f"{name}-{signature.digest}"
        name = self._told[key] = self._told.pop(key)  # put back last
        _forget_oldest(self._told, self.max_types)
        return name

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


def _forget_oldest(names: dict, limit: int) -> None:
    """Drop the least recently used entries (first in `names`) past `limit`, those naming a main lane last."""
    while len(names) > limit:
        oldest = next((key for key, name in names.items() if not name.startswith("main")), next(iter(names)))
        del names[oldest]
