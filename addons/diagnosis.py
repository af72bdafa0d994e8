"""Per-lane prefix diagnosis: how much of the previous prompt a request keeps,
and why not, when it does not.

What is compared: each request against the previous request of its lane, in
prompt order (`prompt_order.py`), as the backend receives it, i.e. after the
addon's rules ran. That is what decides whether a prefix cache can hit.

What is explained: the same pair is also compared as the client sent it. When
that raw pair broke at a place an enabled rule removed (the rotating billing
header, a system message the backend would hoist, a tool ToolSearch loaded),
the line says so ("raw broke at ... (billing header; stripped)"): the rule
earned its keep. Every break of the forwarded pair gets a `cause`:

  <label>; <option> off   a disabled rule's subject sits where it broke
  environment             a line naming the working directory, platform,
                          model or date changed
  mode switch             the agent's mode changed (opencode's plan and build:
                          their turn reminders differ, and so does the `task`
                          tool's list of subagents)
  compaction              the client says so (Claude Code's
                          `x-claude-code-compaction` on the summary request,
                          `x-claude-code-context-compacted` after it,
                          `lanes.told_compaction`); where it does not say:
                          the request newly carries the empty system message
                          Claude Code 2.1.3xx sends after /compact, or the
                          main agent's conversation restarted in the same
                          session (the agent's session header, `lanes.py`)
  late tool change        `tools` changed, and every tool it gained a system
                          message of the conversation adds (Claude Code's
                          late tool changes, `system_messages.late_tool_names`):
                          the client itself changed what comes before the
                          whole history
  history edited          the break lies in the conversation after its first
                          assistant message: a message was changed or the
                          history cut back (a rewind; the summary request of
                          /compact, which appends its instructions to an
                          earlier message)
  context changed         it broke before the first assistant message, but
                          the conversation went on (its first answer is the
                          same): what leads it changed, e.g. the startup
                          context Qwen Code rebuilds for every `qwen
                          --continue` (its folder listing after a new file)
  new conversation        the main agent's conversation restarted (a new
                          session, `/clear`)
  new task                a subagent or side lane's conversation restarted
                          (its first message differs)
  history held by the server  a Responses request continues a stored response
                          (`previous_response_id`) the proxy did not see: what
                          the server puts in front of its input is unknown here
  unexplained             anything else: an edited system prompt, a changed
                          tool set

"Restarted" means it broke before the previous request's first assistant
message. For a lane's first request and for every break, the longest prefix
shared with any of the last `RECENT_REQUESTS` requests of any lane is given
too: what a cache that keeps every lane could still reuse.

    lane main · prefix stable 92,476/92,625 B (99.8%) · first change messages[12] · raw broke at system[0].text byte 47 (billing header; stripped)
    lane main · prefix broke at messages[1].content[0].text byte 48,638 (new conversation) · stable 48,638/49,642 B (98.0%)
    lane sub:9c1e2a@a7268d94 · first request · 22,232 B · 21,310/22,232 B (95.9%) shared with lane sub:9c1e2a@aac66025 #1
"""

from __future__ import annotations

import re
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stable_prefix.addons import responses_input, rules
from stable_prefix.addons.lanes import (
    LaneNames,
    LaneSignature,
    first_prompt_digest,
    lane_group,
    lane_signature,
    session_of,
    told_compaction,
)
from stable_prefix.addons.normalize import Rules
from stable_prefix.addons.prompt_order import (
    Comparison,
    Divergence,
    PromptOrder,
    Segment,
    as_body,
    compare,
    is_system_text,
    message_index,
    path_index,
    prompt_order,
    tool_names,
)
from stable_prefix.addons.request_shape import CONVERSATION_KEY, Api, conversation
from stable_prefix.addons.rules.base import Break, Change, Place
from stable_prefix.addons.rules.system_messages import late_tool_names
from stable_prefix.addons.rules.turn_reminders import agent_mode

ENVIRONMENT = "environment"
MODE_SWITCH = "mode switch"
COMPACTION = "compaction"
CONTEXT_CHANGED = "context changed"
HISTORY_EDITED = "history edited"
LATE_TOOL_CHANGE = "late tool change"
NEW_CONVERSATION = "new conversation"
NEW_TASK = "new task"
SERVER_HISTORY = "history held by the server"
UNEXPLAINED = "unexplained"
# The prompt-order segment naming a stored response whose history the proxy did not see.
PREVIOUS_RESPONSE = "previous_response_id"
# Lines of an environment description that differ by repository, machine,
# model or day (the `environment` cause of a break; no rule removes them).
_ENVIRONMENT_LINE = re.compile(
    r"^[ \t]*(?:-[ \t]*)?(?:Today's date\b|The current date is\b|Current date:|(?:Primary |Current )?working directory\b|Platform:|OS Version:|Shell:"
    r"|Is (?:a git repository|directory a git repo)\b)"
    r"|\bmodel (?:named|ID)\b|\bpowered by the model\b"
    # Codex's <environment_context> message
    r"|^[ \t]*<(?:cwd|current_date|timezone|shell)>",
    re.IGNORECASE,
)
# How many earlier requests (all lanes) a first request or a break is compared
# with for cross-conversation reuse. Each is held as its prompt order (about
# the size of the request body), so memory stays bounded: ~32 bodies.
RECENT_REQUESTS = 32
# What the diagnosis holds per lane (its last prompt, as sent and as forwarded) is bounded, since every
# Claude Code subagent instance is a lane of its own and a day of subagents is thousands of them
# (unbounded, 500 subagent lanes of ~60 KB prompts held ~100 MB). Past either bound the least
# recently used lane goes (a finished subagent never sends again, so its lane is soon the least recently
# used), but the most recently used `PREFERRED_MAIN_LANES` main agent lanes stay: a user reading an
# answer while a fan-out of subagents runs keeps the main lane's diagnosis. Its counts stay in the
# totals; were it to come back it would start as a first request. 128 lanes holds a fan-out of tens of
# subagents besides the main and side lanes of a few conversations; 64 MiB of serialized prompt bytes
# (the prompts' JSON values beside them, about as much again) holds ten 200K-token conversations of both forms.
MAX_LANES = 128
MAX_LANE_PROMPT_BYTES = 64 * 2**20
PREFERRED_MAIN_LANES = 8  # conversations open at once (several terminals on one proxy)
# The counts of lanes let go are kept per subagent type (instance lanes) or per lane (type and side lanes),
# a few hundred bytes each; a type is per agent version and project, so over a long life these grow too:
# past this many of each, the oldest are added up as one entry, `OLDER_LANES`.
MAX_RETIRED = 1024
OLDER_LANES = "(older)"


@dataclass(frozen=True)
class PromptSnapshot:
    """What the diagnosis needs of a body as the client sent it; take it
    before normalizing, since the rules edit the body in place."""

    api: Api
    order: PromptOrder
    signature: LaneSignature
    session: str | None = None  # the conversation, where the agent names it (`lanes.session_of`)
    empty_system_message: bool = False  # what Claude Code 2.1.3xx sends after /compact
    mode: str | None = None  # the agent's mode, from its turn reminders (opencode's plan mode)
    compaction: str | None = None  # what the client says of a compaction (`lanes.told_compaction`)
    late_tools: frozenset[str] = frozenset()  # tools its system messages add mid-conversation

    @classmethod
    def of(cls, body: dict, api: Api, headers: Mapping[str, str] | None = None) -> PromptSnapshot:
        messages = conversation(body, api) or []
        empty = any(isinstance(m, dict) and m.get("role") == "system" and m.get("content") in ("", []) for m in messages)
        return cls(api, prompt_order(body, api), lane_signature(body, api, headers), session_of(headers), empty,
                   agent_mode(body, api), told_compaction(headers), frozenset(late_tool_names(body, api)))


@dataclass(frozen=True)
class Neutralized:
    """A break in the client's bytes that an enabled rule removed."""

    rule: str
    divergence: Divergence

    def to_json(self) -> dict:
        return {"rule": self.rule, **self.divergence.to_json()}


@dataclass(frozen=True)
class SharedPrefix:
    """The longest prefix a request shares with a recent earlier request of any lane."""

    lane: str
    request_in_lane: int
    stable_prefix_bytes: int
    total_bytes: int

    @property
    def ratio(self) -> float:
        return self.stable_prefix_bytes / self.total_bytes if self.total_bytes else 1.0

    def note(self) -> str:
        return f"{self.stable_prefix_bytes:,}/{self.total_bytes:,} B ({self.ratio:.1%}) shared with lane {self.lane} #{self.request_in_lane}"

    def to_json(self) -> dict:
        return {"lane": self.lane, "request_in_lane": self.request_in_lane, "stable_prefix_bytes": self.stable_prefix_bytes, "stable_prefix_ratio": round(self.ratio, 6)}


@dataclass(frozen=True)
class Diagnosis:
    lane: str
    request_in_lane: int  # 1 for the first request of its lane
    comparison: Comparison | None  # None for the first request of its lane
    total_bytes: int
    explained_by: str | None = None  # rule behind the forwarded break (a disabled one)
    neutralized: Neutralized | None = None
    cause: str | None = None  # why the prefix broke (None: it did not)
    shared: SharedPrefix | None = None  # for a first request or a break: the best earlier match

    @property
    def prefix_broke(self) -> bool:
        return self.comparison is not None and not self.comparison.prefix_kept

    def line(self) -> str:
        parts = [f"lane {self.lane}"]
        comparison = self.comparison
        if comparison is None:
            parts.append(f"first request · {self.total_bytes:,} B")
            if self.shared and self.shared.stable_prefix_bytes:
                parts.append(self.shared.note())
        else:
            share = f"{comparison.stable_prefix_bytes:,}/{comparison.total_bytes:,} B ({comparison.stable_prefix_ratio:.1%})"
            divergence = comparison.first_divergence
            if divergence is None:
                parts += [f"prefix stable {share}", "identical"]
            elif comparison.prefix_kept:
                parts += [f"prefix stable {share}", f"first change {divergence.path}"]
            else:
                parts += [f"prefix broke at {divergence.path} byte {divergence.byte_offset:,} ({self.cause})", f"stable {share}"]
                if self.shared and self.shared.stable_prefix_bytes > comparison.stable_prefix_bytes:
                    parts.append(self.shared.note())
        if self.neutralized:
            where = self.neutralized.divergence
            parts.append(f"raw broke at {where.path} byte {where.byte_offset:,} ({rule_note(self.neutralized.rule, applied=True)})")
        return " · ".join(parts)


    def to_json(self) -> dict:
        comparison = self.comparison
        return {
            "lane": self.lane,
            "request_in_lane": self.request_in_lane,
            "first_divergence": comparison.first_divergence.to_json() if comparison and comparison.first_divergence else None,
            "stable_prefix_bytes": comparison.stable_prefix_bytes if comparison else 0,
            "total_bytes": self.total_bytes,
            "previous_total_bytes": comparison.previous_total_bytes if comparison else None,
            "stable_prefix_ratio": round(comparison.stable_prefix_ratio, 6) if comparison else 0.0,
            "prefix_kept": comparison.prefix_kept if comparison else None,
            "explained_by": self.explained_by,
            "cause": self.cause,
            "shared_with_earlier": self.shared.to_json() if self.shared else None,
            "neutralized": self.neutralized.to_json() if self.neutralized else None,
            "line": self.line(),
        }


def rule_note(rule: str, *, applied: bool) -> str:
    """`billing header; stripped` for a break a rule removed; `billing header;
    strip_billing_header off` for one that reached the backend (the rule's
    subject got through, so its option must have been off)."""
    record = rules.rule_named(rule)
    return f"{record.label}; {record.done}" if applied else f"{record.label}; {record.option.name} off"


def untouched_segments(client: PromptSnapshot, changes: list[Change]) -> dict[str, Segment]:
    """The client's segments that the changes cannot have altered or moved.
    Conservative: a change anywhere in `system` or `tools` counts for all of
    it (blocks may have been removed or reordered); on the OpenAI path a
    change to any message counts for all messages (one may have been
    removed, and on the Responses path too); a rule that moves messages
    (`Rule.moves_messages`: the initial context) shifts every message up to
    the last one it moved."""
    key = CONVERSATION_KEY[client.api]
    touched = {change.path.split("[", 1)[0].split(".", 1)[0] for change in changes if not change.path.startswith(f"{key}[")}
    touched_messages = {path_index(change.path) for change in changes if change.path.startswith(f"{key}[")}
    moving = {rule.name for rule in rules.RULES if rule.moves_messages}
    moved = [path_index(change.path) for change in changes if change.rule in moving]
    if moved:
        touched_messages |= set(range(max(moved) + 1))
    if client.api != "anthropic" and touched_messages:
        touched.add(key)

    def untouched(path: str) -> bool:
        top = path.split("[", 1)[0]
        return top not in touched and not (top == key and "[" in path and path_index(path) in touched_messages)

    return {segment.path: segment for segment in client.order.segments if untouched(segment.path)}


def explain(previous: PromptOrder, current: PromptOrder, divergence: Divergence, api: Api) -> str | None:
    """The rule whose subject sits where two prompt orders first differ, or None.

    Every rule is asked, in `rules.RULES` order, as `rules/base.py` says: in
    each prompt's system text where they part (the previous one's first),
    whether that line is its subject, then whether that byte lies in its
    subject; then, place by place, of the whole break."""
    at = Break(previous, current, divergence, api)
    for text in at.system_texts():
        line = text.line
        for rule in rules.RULES:
            if rule.line is not None and rule.line(line):
                return rule.name
        for rule in rules.RULES:
            if rule.spans is not None and any(text.holds(start, end) for start, end in rule.spans(text.text)):
                return rule.name
    for place in Place:
        for rule in rules.RULES:
            if rule.at_break is not None and rule.at_break.place is place and rule.at_break.finds(at):
                return rule.name
    return None


def rule_for_line(line: str) -> str | None:
    """The rule whose subject a line of system text is, if any (what `explain` asks first)."""
    return next((rule.name for rule in rules.RULES if rule.line is not None and rule.line(line)), None)


def is_environment_line(line: str) -> bool:
    """A line naming the working directory, platform, model or date."""
    return bool(_ENVIRONMENT_LINE.search(line))


def _gained_tools(at: Break) -> set[str] | None:
    """The tools the current prompt has and the previous lacks, when they first differ in `tools`
    and it gained some; None otherwise."""
    if not at.in_tools:
        return None
    gained = set(tool_names(at.current)) - set(tool_names(at.previous))
    return gained or None


def _in_conversation(previous: PromptOrder, divergence: Divergence) -> bool:
    """The break lies in one of the previous request's messages (not in system text or tools)."""
    segments = previous.segments
    index = divergence.segment_index
    return index < len(segments) and message_index(segments[index]) is not None and not is_system_text(segments[index])


def _restarts_conversation(previous: PromptOrder, divergence: Divergence) -> bool:
    """The break lies in the conversation, before the previous request's
    first assistant message: the conversation began anew."""
    segments = previous.segments
    first_assistant = next((i for i, s in enumerate(segments) if responses_input.is_model_output(s.value)), len(segments))
    return _in_conversation(previous, divergence) and divergence.segment_index <= first_assistant


def _goes_on(previous: PromptOrder, current: PromptOrder) -> bool:
    """The current prompt continues the previous one's conversation: the same first prompt (its own
    words, reminders aside), followed by an answer (a new conversation has none yet), the same one
    where the previous prompt had one."""
    def opening(order: PromptOrder) -> tuple[str | None, Any]:
        answer = next((s.value for s in order.segments if isinstance(s.value, dict) and s.value.get("role") == "assistant"), None)
        return first_prompt_digest(as_body(order)), answer
    (before_prompt, before_answer), (prompt, answer) = opening(previous), opening(current)
    return before_prompt is not None and prompt == before_prompt and answer is not None and before_answer in (None, answer)


def _changed_lines(previous: PromptOrder, current: PromptOrder, divergence: Divergence) -> list[str]:
    """The line of text, in each prompt, where they first differ (none when
    the difference is not inside a text, e.g. a message added or removed)."""
    index = divergence.segment_index
    if index >= len(previous.segments) or index >= len(current.segments):
        return []
    before, after = _first_difference(previous.segments[index].value, current.segments[index].value)
    if not (isinstance(before, str) and isinstance(after, str)):
        return []
    at = next((i for i, (x, y) in enumerate(zip(before, after, strict=False)) if x != y), min(len(before), len(after)))
    return [_line_around(before, at), _line_around(after, at)]


def _line_around(text: str, at: int) -> str:
    start = text.rfind("\n", 0, at) + 1
    end = text.find("\n", at)
    return text[start : end if end >= 0 else len(text)]


def _first_difference(before: Any, after: Any) -> tuple[Any, Any]:
    """The two values at the first place two JSON values differ, walking keys
    in sorted order as they are serialized."""
    while True:
        if isinstance(before, dict) and isinstance(after, dict):
            key = next((k for k in sorted(set(before) | set(after)) if before.get(k, _MISSING) != after.get(k, _MISSING)), None)
            if key is None or key not in before or key not in after:
                return before, after
            before, after = before[key], after[key]
        elif isinstance(before, list) and isinstance(after, list):
            index = next((i for i in range(min(len(before), len(after))) if before[i] != after[i]), None)
            if index is None:
                return before, after
            before, after = before[index], after[index]
        else:
            return before, after


_MISSING = object()


@dataclass
class LaneState:
    raw: PromptOrder
    forwarded: PromptOrder
    session: str | None = None
    empty_system_message: bool = False
    mode: str | None = None
    requests: int = 0
    compared: int = 0
    kept: int = 0
    stable_bytes: int = 0
    total_bytes: int = 0
    breaks: Counter = field(default_factory=Counter)  # cause -> count
    neutralized: Counter = field(default_factory=Counter)

    @property
    def prompt_bytes(self) -> int:
        """The serialized bytes of the prompts it holds (both forms; shared segments counted twice)."""
        return self.raw.total_bytes + self.forwarded.total_bytes

    def totals(self, lane: str) -> dict:
        return {
            "group": lane_group(lane),
            "requests": self.requests,
            "compared": self.compared,
            "prefix_kept": self.kept,
            "prefix_broke": self.compared - self.kept,
            "stable_prefix_bytes": self.stable_bytes,
            "total_bytes": self.total_bytes,
            "stable_prefix_ratio": round(self.stable_bytes / self.total_bytes, 6) if self.total_bytes else None,
            "breaks": dict(self.breaks),
            "neutralized": dict(self.neutralized),
        }


def is_main_lane(lane: str) -> bool:
    """A lane of the main agent (`main`, `main-<hash>`), not one of its instances' or forks'."""
    return lane.startswith("main") and "@" not in lane


class PrefixDiagnosis:
    """Follows every lane of a session; one `observe()` per request, in order.

    `rules`: the rules the forwarded bodies went through, when known (the
    addon knows them; a folder of captures does not): a break is then never
    blamed on a rule that was on."""

    def __init__(self, rules: Rules | None = None, max_lanes: int = MAX_LANES, max_lane_prompt_bytes: int = MAX_LANE_PROMPT_BYTES) -> None:
        self.rules = rules
        self.lane_names = LaneNames()
        self.lanes: dict[str, LaneState] = {}  # least recently used first
        self.max_lanes, self.max_lane_prompt_bytes = max_lanes, max_lane_prompt_bytes
        self.held_prompt_bytes = 0  # of every lane's state, kept as they change
        # The counts of lanes let go (`_bound`): an instance lane's added up into its group's (one per type, not
        # per instance), a type or side lane's kept under its name (a few: they are not per instance).
        self.retired: dict[str, dict] = {}
        self.retired_lanes: dict[str, dict] = {}
        self.recent: deque[tuple[str, int, PromptOrder]] = deque(maxlen=RECENT_REQUESTS)

    def observe(
        self, client: PromptSnapshot, forwarded_body: dict, lane: str | None = None, changes: list[Change] | None = None
    ) -> Diagnosis:
        """`client`: the body as sent; `forwarded_body`: as it left the proxy.
        `lane` overrides the computed lane (e.g. the one a capture recorded).
        `changes`: when `forwarded_body` is the client's body after these
        changes, the client's serialized segments they did not touch are reused."""
        lane = lane or self.lane_names.name_for(client.signature)
        reuse = untouched_segments(client, changes) if changes is not None else None
        forwarded = prompt_order(forwarded_body, client.api, reuse)
        state = self.lanes.pop(lane, None)  # put back last: the most recently used
        if state is None:
            state = self.lanes[lane] = LaneState(client.order, forwarded, client.session, client.empty_system_message, client.mode, requests=1)
            self.held_prompt_bytes += state.prompt_bytes
            self._bound(lane)
            return self._remember(Diagnosis(lane, 1, None, forwarded.total_bytes, shared=self._best_earlier(forwarded)), forwarded)
        self.lanes[lane] = state
        self.held_prompt_bytes -= state.prompt_bytes
        comparison = compare(state.forwarded, forwarded)
        explained_by = cause = shared = None
        if not comparison.prefix_kept:
            explained_by = explain(state.forwarded, forwarded, comparison.first_divergence, client.api)
            if explained_by and self.rules is not None and self.rules.enabled(explained_by):
                explained_by = None  # its rule ran: the break is not its subject's
            cause = self._cause(lane, state, client, forwarded, comparison.first_divergence, explained_by)
            shared = self._best_earlier(forwarded)
        neutralized = None
        raw_comparison = compare(state.raw, client.order)
        if not raw_comparison.prefix_kept:
            rule = explain(state.raw, client.order, raw_comparison.first_divergence, client.api)
            # A rule that explains the client's break but not the forwarded
            # one removed it (when its option is off, both breaks are its).
            if rule and rule != explained_by and (self.rules is None or self.rules.enabled(rule)):
                neutralized = Neutralized(rule, raw_comparison.first_divergence)
        state.raw, state.forwarded, state.session = client.order, forwarded, client.session or state.session
        state.empty_system_message, state.mode = client.empty_system_message, client.mode
        self.held_prompt_bytes += state.prompt_bytes
        self._bound(lane)
        state.requests += 1
        state.compared += 1
        state.kept += comparison.prefix_kept
        state.stable_bytes += comparison.stable_prefix_bytes
        state.total_bytes += comparison.total_bytes
        if cause:
            state.breaks[cause] += 1
        if neutralized:
            state.neutralized[neutralized.rule] += 1
        result = Diagnosis(lane, state.requests, comparison, forwarded.total_bytes, explained_by, neutralized, cause, shared)
        return self._remember(result, forwarded)

    def _cause(self, lane: str, state: LaneState, client: PromptSnapshot, forwarded: PromptOrder, divergence: Divergence, explained_by: str | None) -> str:
        if explained_by:
            return rule_note(explained_by, applied=False)
        if any(order.segments[divergence.segment_index].path == PREVIOUS_RESPONSE for order in (state.forwarded, forwarded) if divergence.segment_index < len(order.segments)):
            return SERVER_HISTORY
        if client.compaction is not None:
            return COMPACTION  # the client says so: no guess needed
        gained = _gained_tools(Break(state.forwarded, forwarded, divergence, client.api)) if client.late_tools else None
        if gained is not None and gained <= client.late_tools:
            return LATE_TOOL_CHANGE
        if any(is_environment_line(line) for line in _changed_lines(state.forwarded, forwarded, divergence)):
            return ENVIRONMENT
        if client.empty_system_message and not state.empty_system_message:
            return COMPACTION  # wherever it broke: a tool loaded before may have moved too
        if client.mode != state.mode and (client.session is None or client.session == state.session):
            return MODE_SWITCH  # wherever it broke: the tools describe the mode's subagents too
        if not _restarts_conversation(state.forwarded, divergence):
            return HISTORY_EDITED if _in_conversation(state.forwarded, divergence) else UNEXPLAINED
        if _goes_on(state.forwarded, forwarded):
            return CONTEXT_CHANGED
        is_main = lane_group(lane).startswith("main")
        if is_main and client.session is not None and client.session == state.session:
            return COMPACTION
        return NEW_CONVERSATION if is_main else NEW_TASK

    def _bound(self, current: str) -> None:
        """Let lanes go, least recently used first, the most recently used main lanes last, until both
        bounds hold (the current lane stays, however big)."""
        while len(self.lanes) > self.max_lanes or self.held_prompt_bytes > self.max_lane_prompt_bytes:
            others = [lane for lane in self.lanes if lane != current]
            if not others:
                return
            preferred = set([lane for lane in others if is_main_lane(lane)][-PREFERRED_MAIN_LANES:])
            victim = next((lane for lane in others if lane not in preferred), others[0])
            state = self.lanes.pop(victim)
            self.held_prompt_bytes -= state.prompt_bytes
            if lane_group(victim) != victim:
                group = lane_group(victim)
                _add_to_group(self.retired, state.totals(victim))
                self.retired[group] = self.retired.pop(group)  # the most recently let go last
            else:
                self.retired_lanes[victim] = _merged(self.retired_lanes.pop(victim, None), state.totals(victim))
            self._bound_retired()

    def _bound_retired(self) -> None:
        """Add the oldest counts up as `OLDER_LANES` past `MAX_RETIRED` entries of each kind."""
        while len(self.retired_lanes) > MAX_RETIRED:
            lane = next(iter(self.retired_lanes))
            _add_to_group(self.retired, {**self.retired_lanes.pop(lane), "group": OLDER_LANES})
        while len(self.retired) > MAX_RETIRED + 1:  # `OLDER_LANES` itself aside
            group = next(name for name in self.retired if name != OLDER_LANES)
            self.retired[OLDER_LANES] = _merged(self.retired.get(OLDER_LANES), self.retired.pop(group))

    def _best_earlier(self, forwarded: PromptOrder) -> SharedPrefix | None:
        """The longest prefix shared with any recent request (the latest of equals)."""
        best = None
        for lane, number, order in self.recent:
            stable = compare(order, forwarded).stable_prefix_bytes
            if best is None or stable >= best.stable_prefix_bytes:
                best = SharedPrefix(lane, number, stable, forwarded.total_bytes)
        return best

    def _remember(self, result: Diagnosis, forwarded: PromptOrder) -> Diagnosis:
        self.recent.append((result.lane, result.request_in_lane, forwarded))
        return result

    def totals(self) -> dict[str, dict]:
        """Per lane (but instance lanes let go: they are in their group's); `breaks` counts them by cause,
        `group` is the type lane an instance lane belongs to."""
        totals = {lane: _merged(self.retired_lanes.get(lane), state.totals(lane)) for lane, state in self.lanes.items()}
        return totals | {lane: total for lane, total in self.retired_lanes.items() if lane not in totals}

    def group_totals(self) -> dict[str, dict]:
        """The instance lanes of each subagent type, added up, with every lane of it let go (`_bound`)."""
        groups = dict(self.retired)
        for lane, total in self.totals().items():
            if total["group"] != lane:
                _add_to_group(groups, total)
        return groups

    def summary_lines(self) -> list[str]:
        lines = [f"lane {lane} · {total['requests']} requests" + _summary_tail(total) for lane, total in self.totals().items()]
        for group, total in self.group_totals().items():
            lines.append(f"lanes {group}@* · {total['instances']} instances · {total['requests']} requests" + _summary_tail(total))
        return lines


_COUNTS = ("requests", "compared", "prefix_kept", "prefix_broke", "stable_prefix_bytes", "total_bytes")


def _merged(earlier: dict | None, later: dict) -> dict:
    """Two totals added up: one lane's over two spans of it (before it was let go, and since), or two groups'."""
    if earlier is None:
        return later
    merged = {**later, **{key: earlier[key] + later[key] for key in _COUNTS}}
    if "instances" in later:
        merged["instances"] = earlier["instances"] + later["instances"]
    merged["stable_prefix_ratio"] = round(merged["stable_prefix_bytes"] / merged["total_bytes"], 6) if merged["total_bytes"] else None
    for key in ("breaks", "neutralized"):
        merged[key] = dict(Counter(earlier[key]) + Counter(later[key]))
    return merged


def _add_to_group(groups: dict[str, dict], total: dict) -> None:
    """Adds one lane's totals to its group's (a new dict: the groups' entries are never changed in place)."""
    groups[total["group"]] = _merged(groups.get(total["group"]), {**total, "instances": 1})


def _summary_tail(total: dict) -> str:
    tail = ""
    if total["compared"]:
        ratio = total["stable_prefix_ratio"]  # None when the lane's prompts held no bytes at all
        tail += (
            f" · prefix kept {total['prefix_kept']}/{total['compared']}"
            f" · {total['stable_prefix_bytes']:,}/{total['total_bytes']:,} B stable" + (f" ({ratio:.1%})" if ratio is not None else "")
        )
    if total["breaks"]:
        tail += " · breaks: " + ", ".join(f"{cause} ×{count}" for cause, count in sorted(total["breaks"].items()))
    if total["neutralized"]:
        tail += " · fixed by rules: " + ", ".join(f"{rule} ×{count}" for rule, count in sorted(total["neutralized"].items()))
    return tail
