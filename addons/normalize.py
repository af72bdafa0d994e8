"""What is volatile in a Claude Code request, and how it is made stable.

This module is the single owner of that definition. The proxy addon
(`strip_billing.py`), the prefix diagnosis (`diagnosis.py`) and the captures
CLI (`python -m stable_prefix.captures diff --normalized`) all call these functions.

Every rule is a plain function over a parsed request body (a dict) that edits
it in place and returns the `Change`s it made. The line predicates
(`rule_for_line`) are how the diagnosis asks "which rule explains this
divergence?" of a body the rule was never applied to.

Rules that keep the prompt prefix stable:
  billing_header   drop Claude Code's `x-anthropic-billing-header: ...` from the
                   system prompt (it rotates per conversation, sub-agent call
                   or even per request, and it sits at byte 0 of the prompt).
  system_messages  rewrite `role:"system"` items inside `messages` into user
                   messages wrapped in <system-reminder>, because vllm-mlx
                   hoists system messages to the front of the prompt: a new
                   one at the tail would otherwise change the prefix.
  date_line        (off by default) drop a `Today's date is ...` line from the
                   system prompt; it changes once a day.
  tool_order       (off by default) sort `tools` by name.
Compatibility rules (not about the prefix; a self-hosted server needs them):
  model            map the requested model name to the served one.
  max_tokens       cap `max_tokens` to what the server accepts.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Any, Literal

Api = Literal["anthropic", "openai"]

ANTHROPIC_MESSAGES_PATH = "/v1/messages"
OPENAI_CHAT_PATH = "/v1/chat/completions"

# Rule names: these appear in logs, in `Change.rule` and as `explained_by`.
BILLING_HEADER = "billing_header"
SYSTEM_MESSAGES = "system_messages"
DATE_LINE = "date_line"
TOOL_ORDER = "tool_order"
MODEL = "model"
MAX_TOKENS = "max_tokens"

# The rules that change bytes of the prompt itself, in the order they run.
PROMPT_RULES = (BILLING_HEADER, SYSTEM_MESSAGES, DATE_LINE, TOOL_ORDER)

# For messages: how a user would call the rule, and the option that switches it.
RULE_LABEL = {
    BILLING_HEADER: ("billing header", "stripped", "strip_billing_header"),
    SYSTEM_MESSAGES: ("system message", "rewritten", "rewrite_system_messages"),
    DATE_LINE: ("date line", "dropped", "drop_date_line"),
    TOOL_ORDER: ("tool order", "sorted", "sort_tools"),
}

# A line that *starts* with the header; a mention mid-sentence is not one.
_BILLING_LINE = re.compile(r"^[ \t]*x-anthropic-billing-header:", re.IGNORECASE)
_DATE_LINE = re.compile(r"^[ \t]*Today's date is\b")
SYSTEM_REMINDER_OPEN = "<system-reminder>\n"
SYSTEM_REMINDER_CLOSE = "\n</system-reminder>"


@dataclass(frozen=True)
class Change:
    rule: str
    path: str  # JSON path in the body as the rule saw it, e.g. "system[0]"
    detail: str

    def __str__(self) -> str:
        where = "" if self.path == self.rule else f" {self.path}"
        return f"{self.rule}{where}: {self.detail}"


@dataclass(frozen=True)
class Rules:
    """Which rules run. Field names are the addon's option names."""

    strip_billing_header: bool = True
    rewrite_system_messages: bool = True
    drop_date_line: bool = False
    sort_tools: bool = False
    # (fnmatch pattern, served model name); the first matching pattern wins.
    model_map: tuple[tuple[str, str], ...] = ()
    max_tokens_cap: int = 0  # 0: no cap

    def enabled(self, rule: str) -> bool:
        return {
            BILLING_HEADER: self.strip_billing_header,
            SYSTEM_MESSAGES: self.rewrite_system_messages,
            DATE_LINE: self.drop_date_line,
            TOOL_ORDER: self.sort_tools,
            MODEL: bool(self.model_map),
            MAX_TOKENS: self.max_tokens_cap > 0,
        }[rule]


def api_for(method: str, path: str) -> Api | None:
    """Which API a request speaks, or None when the addon must leave it alone.

    Claude Code appends `?beta=true`; a reverse proxy may sit under a prefix
    such as `/anthropic/v1/messages`. `/v1/messages/count_tokens` is not ours.
    """
    if method.upper() != "POST":
        return None
    route = path.split("?", 1)[0].rstrip("/")
    if route.endswith(ANTHROPIC_MESSAGES_PATH):
        return "anthropic"
    if route.endswith(OPENAI_CHAT_PATH):
        return "openai"
    return None


def is_billing_line(line: str) -> bool:
    return bool(_BILLING_LINE.match(line))


def is_date_line(line: str) -> bool:
    return bool(_DATE_LINE.match(line))


def parse_model_map(spec: str) -> tuple[tuple[str, str], ...]:
    """`claude-*haiku*=small,claude-*=big` -> ((pattern, name), ...).

    Raises ValueError naming the entry that is not `pattern=name`.
    """
    pairs = []
    for entry in spec.split(","):
        entry = entry.strip()
        if not entry:
            continue
        pattern, sep, name = entry.partition("=")
        if not sep or not pattern.strip() or not name.strip():
            raise ValueError(f"entry {entry!r} is not of the form pattern=served-model-name")
        pairs.append((pattern.strip(), name.strip()))
    return tuple(pairs)


# --- text helpers -------------------------------------------------------------


def _drop_lines(text: str, is_volatile) -> tuple[str, int]:
    """Remove whole lines for which is_volatile(line) holds, with their line
    break. Returns the new text and how many lines went."""
    lines = text.splitlines(keepends=True)
    kept = [line for line in lines if not is_volatile(line.rstrip("\r\n"))]
    dropped = len(lines) - len(kept)
    if not dropped:
        return text, 0
    result = "".join(kept)
    # "intro\n<header>" must become "intro", not "intro\n".
    if kept and not text.endswith("\n") and result.endswith("\n"):
        result = result[:-1]
    return result, dropped


def _is_text_block(item: Any) -> bool:
    return isinstance(item, dict) and item.get("type") == "text" and isinstance(item.get("text"), str)


def _system_text_places(body: dict, api: Api):
    """Yield (path, container, key) for every piece of system-prompt text.

    Anthropic: `system` as a string or each text block of the `system` list.
    OpenAI: the content (string or text parts) of each leading system message.
    Message content of user/assistant/tool turns is never yielded.
    """
    if api == "anthropic":
        system = body.get("system")
        if isinstance(system, str):
            yield "system", body, "system"
        elif isinstance(system, list):
            for index, block in enumerate(system):
                if _is_text_block(block):
                    yield f"system[{index}]", block, "text"
        return
    messages = body.get("messages")
    if not isinstance(messages, list):
        return
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("system", "developer"):
            break  # only the leading system messages form the system prompt
        content = message.get("content")
        if isinstance(content, str):
            yield f"messages[{index}].content", message, "content"
        elif isinstance(content, list):
            for part_index, part in enumerate(content):
                if _is_text_block(part):
                    yield f"messages[{index}].content[{part_index}]", part, "text"


def system_texts(body: dict, api: Api) -> list[str]:
    """The pieces of system-prompt text, in order (for lane signatures)."""
    return [container[key] for _, container, key in _system_text_places(body, api)]


def _drop_system_lines(body: dict, api: Api, rule: str, is_volatile, what: str) -> list[Change]:
    """Shared by the billing and date rules: drop matching lines from the
    system prompt; a text block or message left empty is removed entirely."""
    changes: list[Change] = []
    emptied: list[tuple[str, Any, str]] = []
    for path, container, key in list(_system_text_places(body, api)):
        new_text, dropped = _drop_lines(container[key], is_volatile)
        if not dropped:
            continue
        if new_text.strip():
            changes.append(Change(rule, path, f"removed {what} line"))
            container[key] = new_text
        else:
            changes.append(Change(rule, path, f"removed {what} block"))
            emptied.append((path, container, key))
    _remove_emptied(body, api, emptied)
    return changes


def _remove_emptied(body: dict, api: Api, emptied: list[tuple[str, Any, str]]) -> None:
    if not emptied:
        return
    if api == "anthropic":
        if isinstance(body.get("system"), str):
            del body["system"]
            return
        gone = {id(container) for _, container, _ in emptied}
        body["system"] = [block for block in body["system"] if id(block) not in gone]
        if not body["system"]:
            del body["system"]
        return
    # OpenAI: a text part left empty goes; a system message left empty goes.
    gone = {id(container) for _, container, _ in emptied}
    for message in body["messages"]:
        if isinstance(message, dict) and isinstance(message.get("content"), list):
            parts = [part for part in message["content"] if id(part) not in gone]
            if len(parts) < len(message["content"]):
                message["content"] = parts
                if not parts:
                    gone.add(id(message))
    body["messages"] = [message for message in body["messages"] if id(message) not in gone]


# --- the rules ----------------------------------------------------------------


def strip_billing_header(body: dict, api: Api) -> list[Change]:
    """Remove `x-anthropic-billing-header: ...` from the system prompt: the
    whole block when it holds nothing else, otherwise only that line."""
    return _drop_system_lines(body, api, BILLING_HEADER, is_billing_line, "billing header")


def drop_date_line(body: dict, api: Api) -> list[Change]:
    """Remove a `Today's date is ...` line from the system prompt."""
    return _drop_system_lines(body, api, DATE_LINE, is_date_line, "date")


def _wrap_reminder(content: Any) -> Any | None:
    """The user-message content for a system message's content, or None when
    it has a shape we do not know how to wrap (then it is left alone)."""
    if isinstance(content, str):
        if content.startswith("<system-reminder>"):
            return content
        return SYSTEM_REMINDER_OPEN + content + SYSTEM_REMINDER_CLOSE
    if isinstance(content, list) and content and all(_is_text_block(block) for block in content):
        # Keep the blocks (and their cache_control); wrap around all of them.
        blocks = [dict(block) for block in content]
        if not blocks[0]["text"].startswith("<system-reminder>"):
            blocks[0]["text"] = SYSTEM_REMINDER_OPEN + blocks[0]["text"]
            blocks[-1]["text"] = blocks[-1]["text"] + SYSTEM_REMINDER_CLOSE
        return blocks
    return None


def rewrite_system_messages(body: dict, api: Api) -> list[Change]:
    """Turn `role:"system"` items inside `messages` into user messages.

    Each rewrite looks at that one message only, so `messages[i]` comes out
    the same on every later turn. On the OpenAI path the leading system
    messages are the system prompt proper and stay.
    """
    messages = body.get("messages")
    if not isinstance(messages, list):
        return []
    changes = []
    in_leading_system = api == "openai"
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            in_leading_system = False
            continue
        if message.get("role") != "system":
            in_leading_system = False
            continue
        if in_leading_system:
            continue
        wrapped = _wrap_reminder(message.get("content"))
        if wrapped is None:
            continue
        changes.append(Change(SYSTEM_MESSAGES, f"messages[{index}]", "system message rewritten as user <system-reminder>"))
        message["role"] = "user"
        message["content"] = wrapped
    return changes


def _tool_name(tool: Any) -> str:
    if not isinstance(tool, dict):
        return ""
    if isinstance(tool.get("name"), str):
        return tool["name"]
    function = tool.get("function")
    if isinstance(function, dict) and isinstance(function.get("name"), str):
        return function["name"]
    return ""


def tool_names(body: dict) -> list[str]:
    tools = body.get("tools")
    return [_tool_name(tool) for tool in tools] if isinstance(tools, list) else []


def sort_tools(body: dict, api: Api) -> list[Change]:
    tools = body.get("tools")
    if not isinstance(tools, list):
        return []
    ordered = sorted(tools, key=_tool_name)  # stable: unnamed tools keep their order
    if ordered == tools:
        return []
    body["tools"] = ordered
    return [Change(TOOL_ORDER, "tools", f"sorted {len(tools)} tools by name")]


def map_model(body: dict, model_map: tuple[tuple[str, str], ...]) -> list[Change]:
    requested = body.get("model")
    if not isinstance(requested, str):
        return []
    for pattern, served in model_map:
        if fnmatch.fnmatchcase(requested, pattern):
            if served == requested:
                return []
            body["model"] = served
            return [Change(MODEL, "model", f"{requested} -> {served}")]
    return []


def cap_max_tokens(body: dict, cap: int) -> list[Change]:
    changes = []
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > cap:
            changes.append(Change(MAX_TOKENS, key, f"{value} -> {cap}"))
            body[key] = cap
    return changes


_PROMPT_RULE_FUNCTIONS = {
    BILLING_HEADER: strip_billing_header,
    SYSTEM_MESSAGES: rewrite_system_messages,
    DATE_LINE: drop_date_line,
    TOOL_ORDER: sort_tools,
}


def normalize(body: dict, api: Api, rules: Rules = Rules()) -> list[Change]:
    """Apply the enabled rules to `body` in place; return what changed."""
    changes: list[Change] = []
    for rule in PROMPT_RULES:
        if rules.enabled(rule):
            changes += _PROMPT_RULE_FUNCTIONS[rule](body, api)
    if rules.enabled(MODEL):
        changes += map_model(body, rules.model_map)
    if rules.enabled(MAX_TOKENS):
        changes += cap_max_tokens(body, rules.max_tokens_cap)
    return changes


def rule_for_line(line: str) -> str | None:
    """Which line rule would drop this system-prompt line, if any. The
    diagnosis uses it to name the cause of a divergence inside system text."""
    if is_billing_line(line):
        return BILLING_HEADER
    if is_date_line(line):
        return DATE_LINE
    return None
