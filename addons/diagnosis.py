"""Per-lane prefix diagnosis: how much of the previous prompt a request keeps.

What is compared: each request against the previous request of its lane, in
prompt order (`prompt_order.py`), as the backend receives it, i.e. after the
addon's rules ran. That is what decides whether a prefix cache can hit.

What is explained: the same pair is also compared as the client sent it. When
that raw pair broke at a place an enabled rule removed (the rotating billing
header, a system message the backend would hoist), the line says so ("raw
broke at ... (billing header; stripped)"): the rule earned its keep. When the
forwarded pair itself broke at a place a *disabled* rule would have removed
(a new date line with drop_date_line off), that rule is named as the cause.
Other breaks are left unexplained: a `/clear` (new conversation), an edited
system prompt, a changed tool set.

    lane main · prefix stable 92,476/92,625 B (99.8%) · first change messages[12] · raw broke at system[0].text byte 47 (billing header; stripped)
    lane main · prefix broke at system[1].text byte 310 · stable 310/9,512 B (3.3%)
    lane side:title · first request · 402 B
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from stable_prefix.addons import normalize
from stable_prefix.addons.lanes import LaneNames, LaneSignature, lane_signature
from stable_prefix.addons.normalize import RULE_LABEL, SYSTEM_MESSAGES, TOOL_ORDER, Api, Change
from stable_prefix.addons.prompt_order import Comparison, Divergence, PromptOrder, Segment, compare, line_at, prompt_order


@dataclass(frozen=True)
class PromptSnapshot:
    """What the diagnosis needs of a body as the client sent it; take it
    before normalizing, since the rules edit the body in place."""

    api: Api
    order: PromptOrder
    signature: LaneSignature

    @classmethod
    def of(cls, body: dict, api: Api) -> PromptSnapshot:
        return cls(api, prompt_order(body, api), lane_signature(body, api))


@dataclass(frozen=True)
class Neutralized:
    """A break in the client's bytes that an enabled rule removed."""

    rule: str
    divergence: Divergence

    def to_json(self) -> dict:
        return {"rule": self.rule, **self.divergence.to_json()}


@dataclass(frozen=True)
class Diagnosis:
    lane: str
    request_in_lane: int  # 1 for the first request of its lane
    comparison: Comparison | None  # None for the first request of its lane
    total_bytes: int
    explained_by: str | None = None  # rule behind the forwarded break (a disabled one)
    neutralized: Neutralized | None = None

    @property
    def prefix_broke(self) -> bool:
        return self.comparison is not None and not self.comparison.prefix_kept

    def line(self) -> str:
        parts = [f"lane {self.lane}"]
        comparison = self.comparison
        if comparison is None:
            parts.append(f"first request · {self.total_bytes:,} B")
        else:
            share = f"{comparison.stable_prefix_bytes:,}/{comparison.total_bytes:,} B ({comparison.stable_prefix_ratio:.1%})"
            divergence = comparison.first_divergence
            if divergence is None:
                parts += [f"prefix stable {share}", "identical"]
            elif comparison.prefix_kept:
                parts += [f"prefix stable {share}", f"first change {divergence.path}"]
            else:
                cause = f" ({rule_note(self.explained_by, applied=False)})" if self.explained_by else ""
                parts += [f"prefix broke at {divergence.path} byte {divergence.byte_offset:,}{cause}", f"stable {share}"]
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
            "neutralized": self.neutralized.to_json() if self.neutralized else None,
            "line": self.line(),
        }


def rule_note(rule: str, *, applied: bool) -> str:
    """`billing header; stripped` for a break a rule removed; `billing header;
    strip_billing_header off` for one that reached the backend (the rule's
    subject got through, so its option must have been off)."""
    label, done, option = RULE_LABEL[rule]
    return f"{label}; {done}" if applied else f"{label}; {option} off"


def untouched_segments(client: PromptSnapshot, changes: list[Change]) -> dict[str, Segment]:
    """The client's segments that the changes cannot have altered or moved.
    Conservative: a change anywhere in `system` or `tools` counts for all of
    it (blocks may have been removed or reordered), and on the OpenAI path a
    change to any message counts for all messages (one may have been removed)."""
    touched = {change.path.split("[", 1)[0].split(".", 1)[0] for change in changes if not change.path.startswith("messages[")}
    touched_messages = {change.path.split("]", 1)[0] + "]" for change in changes if change.path.startswith("messages[")}
    if client.api == "openai" and touched_messages:
        touched.add("messages")

    def untouched(path: str) -> bool:
        top = path.split("[", 1)[0]
        return top not in touched and not (top == "messages" and path in touched_messages)

    return {segment.path: segment for segment in client.order.segments if untouched(segment.path)}


def explain(previous: PromptOrder, current: PromptOrder, divergence: Divergence, api: Api) -> str | None:
    """The rule whose subject sits where two prompt orders first differ, or None."""
    index = divergence.segment_index
    pair = [(order, order.segments[index]) for order in (previous, current) if index < len(order.segments)]
    for _, segment in pair:
        if _is_system_text(segment):
            offset = divergence.offset_in_segment
            rule = normalize.rule_for_line(line_at(segment, min(offset, max(len(segment.data) - 1, 0))))
            if rule:
                return rule
    if any(_is_mid_conversation_system_message(order, segment, api) for order, segment in pair):
        return SYSTEM_MESSAGES
    if any(segment.path.startswith("tools[") for _, segment in pair):
        before, after = _tool_names(previous), _tool_names(current)
        if before != after and sorted(before) == sorted(after):
            return TOOL_ORDER
    return None


def _message_index(segment: Segment) -> int | None:
    return int(segment.path[len("messages[") : segment.path.index("]")]) if segment.path.startswith("messages[") else None


def _is_mid_conversation_system_message(order: PromptOrder, segment: Segment, api: Api) -> bool:
    """A system message the system_messages rule rewrites: any inside an
    Anthropic `messages`; on the OpenAI path only those after the first
    non-system message (the leading ones are the system prompt itself)."""
    index = _message_index(segment)
    if index is None or not (isinstance(segment.value, dict) and segment.value.get("role") == "system"):
        return False
    if api == "anthropic":
        return True
    conversation = [_message_index(s) for s in order.segments if _message_index(s) is not None and s.value.get("role") not in ("system", "developer")]
    return bool(conversation) and index > min(conversation)


def _is_system_text(segment: Segment) -> bool:
    value = segment.value
    return segment.path.startswith("system") or (isinstance(value, dict) and value.get("role") in ("system", "developer"))


def _tool_names(order: PromptOrder) -> list[str]:
    return [normalize.tool_names({"tools": [s.value]})[0] for s in order.segments if s.path.startswith("tools[")]


@dataclass
class LaneState:
    raw: PromptOrder
    forwarded: PromptOrder
    requests: int = 0
    compared: int = 0
    kept: int = 0
    stable_bytes: int = 0
    total_bytes: int = 0
    breaks: Counter = field(default_factory=Counter)  # cause -> count ("unexplained" for none)
    neutralized: Counter = field(default_factory=Counter)


class PrefixDiagnosis:
    """Follows every lane of a session; one `observe()` per request, in order."""

    def __init__(self) -> None:
        self.lane_names = LaneNames()
        self.lanes: dict[str, LaneState] = {}

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
        state = self.lanes.get(lane)
        if state is None:
            state = self.lanes[lane] = LaneState(client.order, forwarded, requests=1)
            return Diagnosis(lane, 1, None, forwarded.total_bytes)
        comparison = compare(state.forwarded, forwarded)
        explained_by = None
        if not comparison.prefix_kept:
            explained_by = explain(state.forwarded, forwarded, comparison.first_divergence, client.api)
        neutralized = None
        raw_comparison = compare(state.raw, client.order)
        if not raw_comparison.prefix_kept:
            rule = explain(state.raw, client.order, raw_comparison.first_divergence, client.api)
            # A rule that explains the client's break but not the forwarded
            # one removed it (when its option is off, both breaks are its).
            if rule and rule != explained_by:
                neutralized = Neutralized(rule, raw_comparison.first_divergence)
        state.raw, state.forwarded = client.order, forwarded
        state.requests += 1
        state.compared += 1
        state.kept += comparison.prefix_kept
        state.stable_bytes += comparison.stable_prefix_bytes
        state.total_bytes += comparison.total_bytes
        if not comparison.prefix_kept:
            state.breaks[explained_by or "unexplained"] += 1
        if neutralized:
            state.neutralized[neutralized.rule] += 1
        return Diagnosis(lane, state.requests, comparison, forwarded.total_bytes, explained_by, neutralized)

    def totals(self) -> dict[str, dict]:
        return {
            lane: {
                "requests": state.requests,
                "compared": state.compared,
                "prefix_kept": state.kept,
                "prefix_broke": state.compared - state.kept,
                "stable_prefix_bytes": state.stable_bytes,
                "total_bytes": state.total_bytes,
                "stable_prefix_ratio": round(state.stable_bytes / state.total_bytes, 6) if state.total_bytes else None,
                "breaks": dict(state.breaks),
                "neutralized": dict(state.neutralized),
            }
            for lane, state in self.lanes.items()
        }

    def summary_lines(self) -> list[str]:
        lines = []
        for lane, total in self.totals().items():
            line = f"lane {lane} · {total['requests']} requests"
            if total["compared"]:
                line += (
                    f" · prefix kept {total['prefix_kept']}/{total['compared']}"
                    f" · {total['stable_prefix_bytes']:,}/{total['total_bytes']:,} B stable ({total['stable_prefix_ratio']:.1%})"
                )
            if total["breaks"]:
                line += " · breaks: " + ", ".join(f"{cause} ×{count}" for cause, count in sorted(total["breaks"].items()))
            if total["neutralized"]:
                line += " · fixed by rules: " + ", ".join(f"{rule} ×{count}" for rule, count in sorted(total["neutralized"].items()))
            lines.append(line)
        return lines
