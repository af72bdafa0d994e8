"""tool_order (off by default): the tool definitions sorted by name.

What the rule does: its option's help below (docs/proxy.md's table shows it).
"""

from __future__ import annotations

from stable_prefix.addons.prompt_order import tool_names
from stable_prefix.addons.request_shape import Api, tool_name
from stable_prefix.addons.rules.base import AtBreak, Break, Change, Option, Place, Rule

NAME = "tool_order"


def sort_tools(body: dict, api: Api) -> list[Change]:
    tools = body.get("tools")
    if not isinstance(tools, list):
        return []
    ordered = sorted(tools, key=tool_name)  # stable: unnamed tools keep their order
    if ordered == tools:
        return []
    body["tools"] = ordered
    return [Change(NAME, "tools", f"sorted {len(tools)} tools by name")]


def reordered(at: Break) -> bool:
    """The break lies among the tools, and the two prompts offer the same tools in another order."""
    if not at.in_tools:
        return False
    before, after = tool_names(at.previous), tool_names(at.current)
    return before != after and sorted(before) == sorted(after)


RULE = Rule(
    name=NAME,
    option=Option("sort_tools", bool, False, "Sort the tool definitions by name."),
    label="tool order",
    done="sorted",
    apply=sort_tools,
    at_break=AtBreak(Place.TOOLS, reordered),
)
