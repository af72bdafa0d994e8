"""What every rule is: one record (`Rule`), the same fields for all.

A rule changes a request body in place so that what a coding agent sends
varies less from one request to the next (`Rule.apply`, returning the
`Change`s it made); an addon option switches it (`Rule.option`: declared by
the addon, `strip_billing.py`, as mitmproxy's `loader.add_option` takes it);
a user reads it as a label (`billing header; stripped`, `billing header;
strip_billing_header off`); and the diagnosis (`diagnosis.py`) asks it
whether a break of a lane's prefix lies in its subject, the break the rule
removes or, switched off, would have removed.

How a rule recognises its subject at a break, in the order the diagnosis asks
(`diagnosis.explain`): in the system text where the two prompts part (each
prompt's segment there, the previous one's first), whether the line holding
that byte is its subject (`Rule.line`), then whether the byte lies in a span
of its subject (`Rule.spans`); then, of the whole break (`Break`), place by
place (`Place`), `Rule.at_break`. A rule with none of them names the rule
whose detectors find its subject (`Rule.named_by`: the initial context's
system messages are the system messages rule's subject too). Lane signatures
leave out what every rule's `line` and `spans` find, on or off
(`rules.without_subjects`), so a rule's subject never splits a lane.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import IntEnum
from functools import cached_property
from typing import Any

from stable_prefix.addons.prompt_order import Divergence, PromptOrder, Segment, is_system_text, line_at
from stable_prefix.addons.request_shape import Api


@dataclass(frozen=True)
class Change:
    rule: str
    path: str  # JSON path in the body as the rule saw it, e.g. "system[0]"
    detail: str

    def __str__(self) -> str:
        where = "" if self.path == self.rule else f" {self.path}"
        return f"{self.rule}{where}: {self.detail}"


@dataclass(frozen=True)
class Option:
    """An addon option, as mitmproxy's `loader.add_option(name, type, default, help)` takes it."""

    name: str
    type: type
    default: Any
    help: str

    def declare(self, loader) -> None:
        loader.add_option(self.name, self.type, self.default, self.help)


class Place(IntEnum):
    """Where a rule asked of the whole break (`Rule.at_break`) looks, in the order the diagnosis asks."""

    SYSTEM_MESSAGE = 1  # a message of either prompt at the break that the server hoists into the system text
    MESSAGE = 2  # the previous prompt's message at the break (the current one's where the previous ran out)
    TOOLS = 3  # the tool definitions, when the break lies among them


@dataclass(frozen=True)
class SystemTextAt:
    """A segment of system text where two prompts part, and the byte of it where they do."""

    segment: Segment
    offset: int

    @cached_property
    def text(self) -> str:
        return self.segment.data.decode("utf-8", "replace")

    @property
    def line(self) -> str:
        return line_at(self.segment, self.offset)

    def holds(self, start: int, end: int | None = None) -> bool:
        """Whether the byte lies in the characters `text[start:end]` (to the end of the text when end is None)."""
        def byte(index: int) -> int:
            return len(self.text[:index].encode("utf-8", "surrogatepass"))

        return byte(start) <= self.offset and (end is None or self.offset < byte(end))


@dataclass(frozen=True)
class Break:
    """Where two prompts of a lane first differ, in prompt order."""

    previous: PromptOrder
    current: PromptOrder
    divergence: Divergence
    api: Api

    @property
    def pair(self) -> list[tuple[PromptOrder, Segment]]:
        """Each prompt's segment where they part, with its prompt, the previous one's first; one
        only, the current one's, where the previous prompt ran out before."""
        index = self.divergence.segment_index
        return [(order, order.segments[index]) for order in (self.previous, self.current) if index < len(order.segments)]

    def system_texts(self) -> list[SystemTextAt]:
        """The segments of the pair that are system text, each with the byte where the prompts part."""
        return [SystemTextAt(segment, min(self.divergence.offset_in_segment, max(len(segment.data) - 1, 0)))
                for _, segment in self.pair if is_system_text(segment)]

    @property
    def in_tools(self) -> bool:
        return any(segment.path.startswith("tools[") for _, segment in self.pair)


@dataclass(frozen=True)
class AtBreak:
    """A rule's question of the whole break, asked at its place (`Place`)."""

    place: Place
    finds: Callable[[Break], bool]


@dataclass(frozen=True)
class Rule:
    """One rule. `apply` runs when `option` is true (every rule's option is a bool)."""

    name: str  # in logs, in `Change.rule`, as the diagnosis's `explained_by`
    option: Option
    label: str  # how a user calls what it changes: `billing header`
    done: str  # what it does to it: `stripped`
    apply: Callable[[dict, Api], list[Change]]
    # Its changes move messages: every message up to the last one a change names has shifted
    # (else a change touches only what its path names; `diagnosis.untouched_segments`).
    moves_messages: bool = False
    # How the diagnosis recognises a break in its subject (the module docstring):
    line: Callable[[str], bool] | None = None  # a line of system text that is its subject
    spans: Callable[[str], Iterable[tuple[int, int | None]]] | None = None  # (start, end) of its subject in a system text
    at_break: AtBreak | None = None
    named_by: str | None = None  # without a detector of its own: the rule whose detectors name its subject
