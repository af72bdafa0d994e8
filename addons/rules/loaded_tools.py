"""loaded_tools: a deferred tool that ToolSearch loaded, written into the tool
result that loaded it instead of into `tools`.

What the rule does, and why: its option's help below (docs/proxy.md's table
shows it).
"""

from __future__ import annotations

import json
import re
from typing import Any

from stable_prefix.addons.prompt_order import as_body, tool_names
from stable_prefix.addons.request_shape import Api, is_text_block, texts, tool_name
from stable_prefix.addons.rules.base import AtBreak, Break, Change, Option, Place, Rule

NAME = "loaded_tools"
# How an inlined tool's schema reads in the tool result that loaded it: the
# encoding ToolSearch itself promises for its results.
INLINED_TOOLS_OPEN = "<functions>\n"
INLINED_TOOLS_CLOSE = "</functions>"
_INLINED_FUNCTION = re.compile(r"^<function>(\{.*\})</function>$", re.MULTILINE)


def _tool_reference_name(block: Any) -> str | None:
    if isinstance(block, dict) and block.get("type") == "tool_reference" and isinstance(block.get("tool_name"), str):
        return block["tool_name"]
    return None


def _tool_results(body: dict, api: Api):
    """Yield (message index, holder, key) for the content of every tool
    result: Anthropic `tool_result` blocks of user messages, OpenAI
    `role:"tool"` messages. (None on the Responses path: no tool there loads
    a `tool_reference`.)"""
    messages = body.get("messages")
    if api == "responses" or not isinstance(messages, list):
        return
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            continue
        if api == "openai":
            if message.get("role") == "tool" and "content" in message:
                yield index, message, "content"
            continue
        if message.get("role") == "user" and isinstance(message.get("content"), list):
            for block in message["content"]:
                if isinstance(block, dict) and block.get("type") == "tool_result" and "content" in block:
                    yield index, block, "content"


def _result_blocks(content: Any) -> tuple[list, bool] | None:
    """A tool result's content as a block list, and whether it came as a JSON
    string (claude-code-router sends OpenAI tool results as
    `JSON.stringify(blocks)`); None for other content."""
    if isinstance(content, list):
        return content, False
    if isinstance(content, str) and content.startswith("[") and "tool_reference" in content:
        try:
            blocks = json.loads(content)
        except ValueError:
            return None
        return (blocks, True) if isinstance(blocks, list) else None
    return None


def tool_reference_names(body: dict, api: Api) -> set[str]:
    """Names of the tools that `tool_reference` blocks in tool results load."""
    names = set()
    for _, holder, key in _tool_results(body, api):
        found = _result_blocks(holder[key])
        if found:
            names |= {name for name in map(_tool_reference_name, found[0]) if name}
    return names


def _is_deferred(tool: Any, api: Api) -> bool:
    """Claude Code marks a tool that ToolSearch loads with `defer_loading`;
    routers translating to the OpenAI form drop that mark, and there only
    ToolSearch's deferred tools are ever named by a tool_reference."""
    if api == "openai":
        return True
    return isinstance(tool, dict) and tool.get("defer_loading") is True


def tool_schema_line(tool: dict) -> str:
    """One tool as a line of ToolSearch's encoding."""
    function = tool["function"] if isinstance(tool.get("function"), dict) else tool
    schema = function.get("parameters", function.get("input_schema", {}))
    entry = {"description": function.get("description", ""), "name": tool_name(tool), "parameters": schema}
    return f"<function>{json.dumps(entry, ensure_ascii=False)}</function>"


def _inlined_content(blocks: list, from_json_string: bool, deferred: dict[str, dict]) -> tuple[Any, list[str]] | None:
    """The tool result's new content, with its references to deferred tools
    replaced by one text block of their schemas, and the names inlined; None
    when it has no such reference or a shape we do not rewrite (a JSON
    string holding anything but text and references we can inline)."""
    names = list(dict.fromkeys(name for name in map(_tool_reference_name, blocks) if name in deferred))
    if not names:
        return None
    if from_json_string and not all(_tool_reference_name(b) in deferred or is_text_block(b) for b in blocks):
        return None
    text = INLINED_TOOLS_OPEN + "".join(tool_schema_line(deferred[name]) + "\n" for name in names) + INLINED_TOOLS_CLOSE
    content, placed = [], False
    for block in blocks:
        if _tool_reference_name(block) not in deferred:
            content.append(block)
        elif not placed:
            content.append({"type": "text", "text": text})
            placed = True
    if from_json_string:
        return "\n".join(block["text"] for block in content), names
    return content, names


def inline_loaded_tools(body: dict, api: Api) -> list[Change]:
    tools = body.get("tools")
    if not isinstance(tools, list):
        return []
    deferred = {tool_name(tool): tool for tool in tools if tool_name(tool) and _is_deferred(tool, api)}
    if not deferred:
        return []
    inlined: dict[str, None] = {}
    changes = []
    for index, holder, key in list(_tool_results(body, api)):
        found = _result_blocks(holder[key])
        rewritten = _inlined_content(*found, deferred) if found else None
        if rewritten is None:
            continue
        holder[key], names = rewritten
        inlined |= dict.fromkeys(names)
        changes.append(Change(NAME, f"messages[{index}]", f"schema of {', '.join(names)} written into the tool result that loaded it"))
    kept = [tool for tool in tools if tool_name(tool) not in inlined]
    if inlined:
        changes.append(Change(NAME, "tools", f"loaded tool {', '.join(inlined)} taken out of tools"))
    ordered, moved = _unloaded_last(body, api, kept)
    if moved:
        changes.append(Change(NAME, "tools", f"deferred tool {', '.join(moved)}, loaded by no tool_reference, put last"))
    if inlined or moved:
        body["tools"] = ordered
    return changes


def _unloaded_last(body: dict, api: Api, tools: list) -> tuple[list, list[str]]:
    """`tools` with the deferred ones no reference loads at the end (Claude
    Code's placeholder; after /compact, a tool whose ToolSearch result the
    summary replaced), so the tools sent in full still lead; and the names of
    those that moved. Anthropic only: on the OpenAI path no tool says it is
    deferred."""
    if api != "anthropic":
        return tools, []
    referenced = tool_reference_names(body, api)
    unloaded = {id(tool) for tool in tools if _is_deferred(tool, api) and tool_name(tool) not in referenced}
    ordered = [tool for tool in tools if id(tool) not in unloaded] + [tool for tool in tools if id(tool) in unloaded]
    moved = [tool_name(tool) for tool in tools if id(tool) in unloaded] if list(map(id, ordered)) != list(map(id, tools)) else []
    return ordered, moved


def deferred_tool_names(body: dict, api: Api) -> set[str]:
    """Tools that are not part of what a conversation starts with: Anthropic
    tools marked `defer_loading`; on the OpenAI path (where routers drop that
    mark) tools a `tool_reference` loaded."""
    if api == "openai":
        return tool_reference_names(body, api)
    tools = body.get("tools")
    return {tool_name(tool) for tool in tools if _is_deferred(tool, api)} if isinstance(tools, list) else set()


def inlined_tool_names(body: dict, api: Api) -> set[str]:
    """Names of the tools whose schemas `inline_loaded_tools` wrote into tool
    results: they are offered as much as those in `tools`."""
    names = set()
    for _, holder, key in _tool_results(body, api):
        for text in texts(holder[key]):
            if text.startswith(INLINED_TOOLS_OPEN):
                names |= {name for name in map(_inlined_function_name, _INLINED_FUNCTION.findall(text)) if name}
    return names


def _inlined_function_name(entry_json: str) -> str | None:
    try:
        entry = json.loads(entry_json)
    except ValueError:
        return None
    return entry.get("name") if isinstance(entry, dict) and isinstance(entry.get("name"), str) else None


def gained_loaded_tools(at: Break) -> bool:
    """The break lies among the tools, and every tool the current prompt gained is a deferred one
    that a tool_reference in it loaded."""
    if not at.in_tools:
        return False
    gained = set(tool_names(at.current)) - set(tool_names(at.previous))
    if not gained:
        return False
    body = as_body(at.current)
    return gained <= deferred_tool_names(body, at.api) & tool_reference_names(body, at.api)


RULE = Rule(
    name=NAME,
    option=Option(
        "inline_loaded_tools", bool, True,
        "A tool marked `defer_loading` that a `tool_reference` block in a tool result loaded (ToolSearch) is taken out "
        "of `tools`, and its schema is written into that tool result in place of the reference, as ToolSearch's own "
        "description encodes it: `<functions>` / one `<function>{\"description\": …, \"name\": …, \"parameters\": …}"
        "</function>` line per tool / `</functions>`. `tools`, rendered before the whole history (a tool inserted there "
        "mid-conversation re-read all that follows), stays what the conversation started with; a deferred "
        "tool no reference loads (Claude Code's placeholder; a tool loaded before `/compact`, whose ToolSearch result "
        "the summary replaced) goes last. On the OpenAI path (claude-code-router drops `defer_loading` and sends tool "
        "results as the JSON text of their blocks) a tool named by a `tool_reference` counts as loaded: ToolSearch only "
        "loads deferred tools. A result holding anything but text and such references is left alone, and so is its "
        "tool. The tool stays callable: vllm-mlx 0.6.0's tool parsers (qwen, hermes; the same code behind "
        "`/v1/messages` and `/v1/chat/completions`) return a call whatever its name, never checking it against "
        "`tools`, and `toolcall_stream.py` counts inlined tools as offered.",
    ),
    label="loaded tool",
    done="inlined",
    apply=inline_loaded_tools,
    at_break=AtBreak(Place.TOOLS, gained_loaded_tools),
)
