"""What is volatile in a coding agent's request, and how it is made stable.

This module is the single owner of that definition. The proxy addon
(`strip_billing.py`), the prefix diagnosis (`diagnosis.py`) and the captures
CLI (`python -m stable_prefix.captures diff --normalized`) all call these functions.

Every rule is a plain function over a parsed request body (a dict) that edits
it in place and returns the `Change`s it made. Three APIs: Anthropic messages
(`system`, `messages`), OpenAI chat completions (leading system messages in
`messages`) and the Responses API (`instructions`, leading developer/system
items in `input`; its item vocabulary is `responses_input.py`). The line predicates
(`rule_for_line`) are how the diagnosis asks "which rule explains this
divergence?" of a body the rule was never applied to.

Rules that keep the prompt prefix stable:
  billing_header   drop Claude Code's `x-anthropic-billing-header: ...` from the
                   system prompt (it rotates per conversation, sub-agent call
                   or even per request, and it sits at byte 0 of the prompt).
  git_status       move a git status paragraph (`gitStatus: ...` to the end of
                   its system text block; older Claude Code releases) out of
                   the system prompt into a <system-reminder> at the start of
                   the first user message: it changes with every commit and
                   sat before the tools.
  initial_context  move the `role:"system"` messages that come before any
                   assistant message (Claude Code 2.1.3xx sends its
                   environment so, behind the git status) to just before the
                   first user message, rewritten as below: a new conversation
                   in the same repository then shares system, tools and that
                   context, and parts only at the first user message.
  system_messages  rewrite `role:"system"` items inside `messages` into user
                   messages wrapped in <system-reminder>, because vllm-mlx
                   hoists system messages to the front of the prompt: a new
                   one at the tail would otherwise change the prefix. Empty
                   ones too. On the Responses path `developer` items as well
                   (Codex appends one when the sandbox or approval policy
                   of a conversation changes).
  conversation_context
                   move system-prompt text that changes from one conversation
                   to the next but sits before the tools (opencode's `Today's
                   date:` line; Qwen Code's git snapshot and memory section)
                   verbatim into a <system-reminder> in the first user
                   message, after the reminders that message starts with: a
                   new conversation the next day or after a commit then
                   shares system prompt and tools.
  turn_reminders   move a reminder that the agent attaches to its newest user
                   message for one request only (Qwen Code's current date,
                   opencode's plan-mode and switch-to-build reminders) to the
                   first user message, after the reminders it starts with:
                   every request then carries it in the same place, where the
                   agent's next request would have lost it from the previous
                   turn's message and so re-read that whole turn.
  loaded_tools     a deferred tool (`defer_loading`) that a `tool_reference`
                   in a tool result loaded (ToolSearch) is taken out of
                   `tools` and its schema written into that tool result as
                   text, so `tools`, rendered before the whole history, stays
                   what the conversation started with; a deferred tool no
                   reference loads (after /compact) goes last.
  date_line        (off by default) drop a `Today's date is ...` line from the
                   system prompt; it changes once a day.
  tool_order       (off by default) sort `tools` by name.
Compatibility rules (not about the prefix; a self-hosted server needs them):
  model            map the requested model name to the served one.
  max_tokens       cap `max_tokens` to what the server accepts.
  strict_router    (off by default; a team's proxy before smg turns it on)
                   make an Anthropic or Responses body what a router that
                   parses it into a strict schema accepts, dropping only what
                   vllm-mlx 0.6.0 ignores anyway (its pydantic request models
                   read no other field; `STRICT_ROUTER_MESSAGE_FIELDS`):
                   fields of a message besides role and content (Claude Code
                   2.1.332's environment message carries `output_config`,
                   and smg answers 400 `unknown field`); `thinking` whose
                   `budget_tokens` is not below `max_tokens` (after the cap;
                   smg answers 400). On the Responses path smg sets
                   `temperature: 1.0` on a request without one, where the
                   engine would sample at its own default: the rule writes
                   that default (`ENGINE_DEFAULT_TEMPERATURE`) so the router
                   changes nothing; and it refuses top-level fields outside
                   its schema: those the engine ignores too go (Codex's
                   `client_metadata`), one the engine reads stays.
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from stable_prefix.addons import responses_input
from stable_prefix.addons.responses_input import RESPONSES_PATH, TEXT_PART_TYPES

Api = Literal["anthropic", "openai", "responses"]

ANTHROPIC_MESSAGES_PATH = "/v1/messages"
OPENAI_CHAT_PATH = "/v1/chat/completions"
# Where each API keeps its conversation.
CONVERSATION_KEY = {"anthropic": "messages", "openai": "messages", "responses": "input"}
# The text block type a rule writes into a message it builds.
TEXT_TYPE = {"anthropic": "text", "openai": "text", "responses": responses_input.INPUT_TEXT}
# The roles the server hoists to the front of the prompt, wherever they sit.
HOISTED_ROLES = {"anthropic": ("system",), "openai": ("system",), "responses": responses_input.SYSTEM_ROLES}

# Rule names: these appear in logs, in `Change.rule` and as `explained_by`.
BILLING_HEADER = "billing_header"
SYSTEM_MESSAGES = "system_messages"
DATE_LINE = "date_line"
TOOL_ORDER = "tool_order"
GIT_STATUS = "git_status"
INITIAL_CONTEXT = "initial_context"
LOADED_TOOLS = "loaded_tools"
CONVERSATION_CONTEXT = "conversation_context"
TURN_REMINDERS = "turn_reminders"
MODEL = "model"
MAX_TOKENS = "max_tokens"
STRICT_ROUTER = "strict_router"
# What vllm-mlx 0.6.0 reads of an Anthropic message (`api/anthropic_models.py: AnthropicMessage`); the rest is ignored.
STRICT_ROUTER_MESSAGE_FIELDS = ("role", "content")
# What vllm-mlx 0.6.0 reads of a Responses request (`api/responses_models.py: ResponsesRequest`).
ENGINE_RESPONSES_FIELDS = ("model", "input", "instructions", "max_output_tokens", "stream", "tools", "tool_choice",
                           "parallel_tool_calls", "previous_response_id", "temperature", "top_p", "chat_template_kwargs",
                           "metadata", "text", "reasoning", "store", "truncation", "user")
# The top-level fields smg 1.13's Responses schema accepts (its 400 lists them); any other is refused.
STRICT_ROUTER_RESPONSES_FIELDS = ("include", "background", "input", "instructions", "max_output_tokens", "max_tool_calls", "metadata",
                                  "model", "conversation", "parallel_tool_calls", "previous_response_id", "reasoning", "service_tier",
                                  "store", "stream", "temperature", "tool_choice", "tools", "top_logprobs", "top_p", "truncation", "text",
                                  "user", "request_id", "priority", "frequency_penalty", "presence_penalty", "stop", "prompt",
                                  "prompt_cache_key", "prompt_cache_retention", "safety_identifier", "stream_options",
                                  "context_management", "top_k", "min_p", "repetition_penalty")
# vllm-mlx 0.6.0's temperature for a request without one (`server.py: _FALLBACK_TEMPERATURE`; a replica's
# --default-temperature replaces it: then set the same temperature in the client).
ENGINE_DEFAULT_TEMPERATURE = 0.7

# The rules that change bytes of the prompt itself, in the order they run. The
# git status goes into the first user message before the initial context is
# put in front of that message; the conversation context and turn reminders go
# into it after the git status, before system messages become user messages.
PROMPT_RULES = (BILLING_HEADER, GIT_STATUS, CONVERSATION_CONTEXT, TURN_REMINDERS, INITIAL_CONTEXT, SYSTEM_MESSAGES,
                LOADED_TOOLS, DATE_LINE, TOOL_ORDER)

# For messages: how a user would call the rule, and the option that switches it.
RULE_LABEL = {
    BILLING_HEADER: ("billing header", "stripped", "strip_billing_header"),
    SYSTEM_MESSAGES: ("system message", "rewritten", "rewrite_system_messages"),
    DATE_LINE: ("date line", "dropped", "drop_date_line"),
    TOOL_ORDER: ("tool order", "sorted", "sort_tools"),
    GIT_STATUS: ("git status", "moved to the first user message", "relocate_git_status"),
    INITIAL_CONTEXT: ("initial system message", "moved before the first user message", "lead_with_stable_context"),
    LOADED_TOOLS: ("loaded tool", "inlined", "inline_loaded_tools"),
    CONVERSATION_CONTEXT: ("conversation context", "moved to the first user message", "relocate_conversation_context"),
    TURN_REMINDERS: ("turn reminder", "pinned to the first user message", "pin_turn_reminders"),
}

# A line that *starts* with the header; a mention mid-sentence is not one.
_BILLING_LINE = re.compile(r"^[ \t]*x-anthropic-billing-header:", re.IGNORECASE)
_DATE_LINE = re.compile(r"^[ \t]*Today's date is\b")
# Where a git status paragraph starts: a line opening with `gitStatus:`. It
# runs to the end of its text block (the status itself holds blank lines, and
# releases that send it put it last in the system prompt).
_GIT_STATUS_LINE = re.compile(r"^[ \t]*gitStatus:", re.MULTILINE)
# Lines of an environment description that differ by repository, machine,
# model or day (the `environment` cause of a break; no rule removes them).
_ENVIRONMENT_LINE = re.compile(
    r"^[ \t]*(?:-[ \t]*)?(?:Today's date\b|The current date is\b|(?:Primary )?working directory\b|Platform:|OS Version:|Shell:"
    r"|Is (?:a git repository|directory a git repo)\b)"
    r"|\bmodel (?:named|ID)\b|\bpowered by the model\b"
    # Codex's <environment_context> message
    r"|^[ \t]*<(?:cwd|current_date|timezone|shell)>",
    re.IGNORECASE,
)
SYSTEM_REMINDER_OPEN = "<system-reminder>\n"
SYSTEM_REMINDER_CLOSE = "\n</system-reminder>"
# What each agent puts where a prefix cache loses it, found by how it opens
# (the agents' own texts stay theirs: these openings are all we need of them).
#
# Conversation context: text that changes from one conversation to the next (a
# day, a commit, a saved memory) and sits before the tools or before stable
# reminders. opencode 1.18 ends its system prompt's <env> block with `Today's
# date: Tue Dec 01 2026`; Qwen Code 0.24 ends its system prompt with a git
# snapshot (branch, status, recent commits; rebuilt by every `qwen` process)
# and then its memory section (which grows as memories are saved), and leads
# its first user message with reminders, one of them the startup context
# (date, working directory, folder listing) between two that never change.
# (what, how volatile: where it goes among the moved pieces, 0 first, pattern).
# A date line is one line; the others run to the next one that starts or to the
# end of the text.
_DATE_FIELD_LINE = re.compile(r"^[ \t]*Today's date: [^\n]*(?:\n|$)", re.MULTILINE)
SYSTEM_CONTEXT_OPENINGS = (
    ("date line", 1, _DATE_FIELD_LINE),
    ("git snapshot", 2, re.compile(r"^Git snapshot at conversation start\b", re.MULTILINE)),
    ("memory section", 0, re.compile(r"^# auto memory$", re.MULTILINE)),
)
# A reminder block of the first user message that is conversation context.
STARTUP_CONTEXT = ("startup context", 1, re.compile(r"<system-reminder>\s*This is the Qwen Code\. We are setting up the context\b"))
# A reminder an agent puts on its newest user message for one request and
# leaves off that message on the next: (name, whether it names the agent's
# mode, how its text part opens). Qwen Code 0.24: the current date, before the
# prompt; opencode 1.18: the plan-mode reminder, and after a plan the
# switch-to-build one, after the prompt.
TURN_REMINDER_OPENINGS = (
    ("current date", False, re.compile(r"<system-reminder>\s*The current date is:")),
    ("plan mode", True, re.compile(r"<system-reminder>\s*# Plan Mode\b")),
    ("build after plan", True, re.compile(r"<system-reminder>\s*Your operational mode has changed\b")),
)
_REMINDER_END = re.compile(r"</system-reminder>\s*$")
# How an inlined tool's schema reads in the tool result that loaded it: the
# encoding ToolSearch itself promises for its results.
INLINED_TOOLS_OPEN = "<functions>\n"
INLINED_TOOLS_CLOSE = "</functions>"
_INLINED_FUNCTION = re.compile(r"^<function>(\{.*\})</function>$", re.MULTILINE)


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
    relocate_git_status: bool = True
    lead_with_stable_context: bool = True
    inline_loaded_tools: bool = True
    relocate_conversation_context: bool = True
    pin_turn_reminders: bool = True
    drop_date_line: bool = False
    sort_tools: bool = False
    # (fnmatch pattern, served model name); the first matching pattern wins.
    model_map: tuple[tuple[str, str], ...] = ()
    max_tokens_cap: int = 0  # 0: no cap
    strict_router_body: bool = False

    def enabled(self, rule: str) -> bool:
        return {
            BILLING_HEADER: self.strip_billing_header,
            SYSTEM_MESSAGES: self.rewrite_system_messages,
            GIT_STATUS: self.relocate_git_status,
            INITIAL_CONTEXT: self.lead_with_stable_context,
            LOADED_TOOLS: self.inline_loaded_tools,
            CONVERSATION_CONTEXT: self.relocate_conversation_context,
            TURN_REMINDERS: self.pin_turn_reminders,
            DATE_LINE: self.drop_date_line,
            TOOL_ORDER: self.sort_tools,
            MODEL: bool(self.model_map),
            MAX_TOKENS: self.max_tokens_cap > 0,
            STRICT_ROUTER: self.strict_router_body,
        }[rule]


def api_for(method: str, path: str) -> Api | None:
    """Which API a request speaks, or None when the addon must leave it alone.

    Claude Code appends `?beta=true`; a reverse proxy may sit under a prefix
    such as `/anthropic/v1/messages`. `/v1/messages/count_tokens` is not ours,
    nor `/v1/responses/input_tokens` or `/v1/responses/{id}/cancel`.
    """
    if method.upper() != "POST":
        return None
    route = path.split("?", 1)[0].rstrip("/")
    if route.endswith(ANTHROPIC_MESSAGES_PATH):
        return "anthropic"
    if route.endswith(OPENAI_CHAT_PATH):
        return "openai"
    if route.endswith(RESPONSES_PATH):
        return "responses"
    return None


def conversation(body: dict, api: Api) -> list | None:
    """The list of messages (items, on the Responses path), or None."""
    value = body.get(CONVERSATION_KEY[api])
    return value if isinstance(value, list) else None


def _is_message(item: Any, api: Api) -> bool:
    return responses_input.is_message(item) if api == "responses" else isinstance(item, dict)


def _leading_count(body: dict, api: Api, roles: tuple[str, ...]) -> int:
    """How many messages at the start are the system prompt proper (OpenAI's
    leading system messages, Responses' leading developer/system items). On
    the Responses path a request that continues a stored response
    (`previous_response_id`) has none: the server puts the history first."""
    messages = conversation(body, api)
    if api == "anthropic" or messages is None or (api == "responses" and body.get("previous_response_id")):
        return 0
    count = 0
    while count < len(messages) and _is_message(messages[count], api) and messages[count].get("role") in roles:
        count += 1
    return count


def is_billing_line(line: str) -> bool:
    return bool(_BILLING_LINE.match(line))


def is_date_line(line: str) -> bool:
    return bool(_DATE_LINE.match(line))


def is_environment_line(line: str) -> bool:
    """A line naming the working directory, platform, model or date."""
    return bool(_ENVIRONMENT_LINE.search(line))


def git_status_start(text: str) -> int | None:
    """Where the git status paragraph of a system text starts (a character
    offset), or None when it has none."""
    match = _GIT_STATUS_LINE.search(text)
    return match.start() if match else None


def conversation_context_spans(text: str) -> list[tuple[int, int, str]]:
    """Where a system text holds conversation context (`SYSTEM_CONTEXT_OPENINGS`):
    (start, end, what) character spans, in order, each ending after its line break."""
    starts = sorted((match.start(), match.end(), what, pattern is _DATE_FIELD_LINE)
                    for what, _, pattern in SYSTEM_CONTEXT_OPENINGS for match in pattern.finditer(text))
    spans = []
    for index, (start, line_end, what, one_line) in enumerate(starts):
        end = line_end if one_line else (starts[index + 1][0] if index + 1 < len(starts) else len(text))
        spans.append((start, end, what))
    return spans


def _context_rank(what: str) -> int:
    return next(rank for name, rank, _ in (*SYSTEM_CONTEXT_OPENINGS, STARTUP_CONTEXT) if name == what)


def _is_startup_context(block: Any) -> bool:
    return _is_text_block(block) and bool(STARTUP_CONTEXT[2].match(block["text"]))


def _without_spans(text: str, spans: list[tuple[int, int, str]]) -> str:
    """`text` with the (start, end, _) spans cut out; the spans are in order and do not overlap."""
    kept, position = [], 0
    for start, end, _ in spans:
        kept.append(text[position:start])
        position = end
    return "".join(kept) + text[position:]


def turn_reminder_name(part: Any) -> str | None:
    """The name of the turn reminder a text part of a user message is (the whole part), or None."""
    if not _is_text_block(part) or not _REMINDER_END.search(part["text"]):
        return None
    return next((name for name, _, opening in TURN_REMINDER_OPENINGS if opening.match(part["text"])), None)


def turn_reminders(body: dict, api: Api) -> list[str]:
    """The names of the turn reminders in a request's user messages, in order."""
    names = []
    for message in conversation(body, api) or []:
        content = message.get("content") if isinstance(message, dict) and message.get("role") == "user" else None
        if isinstance(content, list):
            names += [name for name in map(turn_reminder_name, content) if name]
    return names


def agent_mode(body: dict, api: Api) -> str | None:
    """The mode a request's turn reminders name last (opencode's plan mode, or build after a plan), or None."""
    modes = {name for name, names_mode, _ in TURN_REMINDER_OPENINGS if names_mode}
    return next((name for name in reversed(turn_reminders(body, api)) if name in modes), None)


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
    break. Returns the new text and how many lines went. A line ends at "\n"
    (as in the diagnosis and the git status paragraph), not wherever Python's
    splitlines breaks (also at \r, \x85, U+2028...: a fuzz find)."""
    pieces = text.split("\n")
    lines = [piece + "\n" for piece in pieces[:-1]] + [pieces[-1]]
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
    """A text block (Anthropic, OpenAI) or text part (Responses: input_text, output_text)."""
    return isinstance(item, dict) and item.get("type") in TEXT_PART_TYPES and isinstance(item.get("text"), str)


def _system_text_places(body: dict, api: Api):
    """Yield (path, container, key) for every piece of system-prompt text.

    Anthropic: `system` as a string or each text block of the `system` list.
    OpenAI: the content (string or text parts) of each leading system message.
    Responses: `instructions`, then the leading developer/system items.
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
    if api == "responses" and isinstance(body.get("instructions"), str):
        yield "instructions", body, "instructions"
    messages, key = conversation(body, api), CONVERSATION_KEY[api]
    # only the leading system messages form the system prompt
    for index in range(_leading_count(body, api, responses_input.SYSTEM_ROLES)):
        message = messages[index]
        content = message.get("content")
        if isinstance(content, str):
            yield f"{key}[{index}].content", message, "content"
        elif isinstance(content, list):
            for part_index, part in enumerate(content):
                if _is_text_block(part):
                    yield f"{key}[{index}].content[{part_index}]", part, "text"


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
    if any(container is body for _, container, _ in emptied):  # Responses: `instructions` left empty
        del body["instructions"]
    # OpenAI, Responses: a text part left empty goes; a system message left empty goes.
    gone = {id(container) for _, container, _ in emptied}
    key = CONVERSATION_KEY[api]
    if not isinstance(body.get(key), list):
        return
    for message in body[key]:
        if isinstance(message, dict) and isinstance(message.get("content"), list):
            parts = [part for part in message["content"] if id(part) not in gone]
            if len(parts) < len(message["content"]):
                message["content"] = parts
                if not parts:
                    gone.add(id(message))
    body[key] = [message for message in body[key] if id(message) not in gone]


# --- the rules ----------------------------------------------------------------


def strip_billing_header(body: dict, api: Api) -> list[Change]:
    """Remove `x-anthropic-billing-header: ...` from the system prompt: the
    whole block when it holds nothing else, otherwise only that line."""
    return _drop_system_lines(body, api, BILLING_HEADER, is_billing_line, "billing header")


def drop_date_line(body: dict, api: Api) -> list[Change]:
    """Remove a `Today's date is ...` line from the system prompt."""
    return _drop_system_lines(body, api, DATE_LINE, is_date_line, "date")


def _wrap_reminder(content: Any, text_type: str = "text") -> Any | None:
    """The user-message content for a system message's content, or None when
    it has a shape we do not know how to wrap (then it is left alone)."""
    if isinstance(content, str):
        if content.startswith("<system-reminder>"):
            return content
        return SYSTEM_REMINDER_OPEN + content + SYSTEM_REMINDER_CLOSE
    if content == []:  # Claude Code sends `[]` after /compact; empty is still a system message to hoist
        return [{"type": text_type, "text": SYSTEM_REMINDER_OPEN + SYSTEM_REMINDER_CLOSE}]
    if isinstance(content, list) and content and all(_is_text_block(block) for block in content):
        # Keep the blocks (and their cache_control); wrap around all of them.
        blocks = [dict(block) for block in content]
        if not blocks[0]["text"].startswith("<system-reminder>"):
            blocks[0]["text"] = SYSTEM_REMINDER_OPEN + blocks[0]["text"]
            blocks[-1]["text"] = blocks[-1]["text"] + SYSTEM_REMINDER_CLOSE
        return blocks
    return None


def rewrite_system_messages(body: dict, api: Api) -> list[Change]:
    """Turn `role:"system"` items inside `messages` into user messages (on the
    Responses path `developer` items too: the server hoists both).

    Each rewrite looks at that one message only, so `messages[i]` comes out
    the same on every later turn. On the OpenAI and Responses paths the
    leading system messages are the system prompt proper and stay.
    """
    messages = conversation(body, api)
    if messages is None:
        return []
    roles = HOISTED_ROLES[api]
    changes = []
    for index in range(_leading_count(body, api, roles), len(messages)):
        message = messages[index]
        if not _is_message(message, api) or message.get("role") not in roles:
            continue
        wrapped = _wrap_reminder(message.get("content"), TEXT_TYPE[api])
        if wrapped is None:
            continue
        changes.append(Change(SYSTEM_MESSAGES, f"{CONVERSATION_KEY[api]}[{index}]", f"{message['role']} message rewritten as user <system-reminder>"))
        message["role"] = "user"
        message["content"] = wrapped
    return changes


def _first_user_index(messages: list) -> int | None:
    return next((i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"), None)


def _is_reminder_block(block: Any) -> bool:
    return _is_text_block(block) and block["text"].startswith("<system-reminder>")


def _first_user_with_blocks(body: dict, api: Api) -> int | None:
    """The index of the first user message, when its content can take text blocks (a string or a list)."""
    messages = conversation(body, api)
    first_user = _first_user_index(messages) if messages is not None else None
    return first_user if first_user is not None and _as_blocks(messages[first_user].get("content")) is not None else None


def _insert_after_leading_reminders(messages: list, index: int, blocks: list, text_type: str) -> None:
    """Put text blocks into `messages[index]` after the <system-reminder> blocks it starts with,
    turn reminders aside (a string content becomes one text block): what the agent itself leads
    with stays first, then conversation context, then turn reminders, which change most."""
    content = _as_blocks(messages[index]["content"], text_type)
    lead = next((i for i, block in enumerate(content) if not _is_reminder_block(block) or turn_reminder_name(block)), len(content))
    messages[index] = {**messages[index], "content": content[:lead] + blocks + content[lead:]}


def _as_blocks(content: Any, text_type: str = "text") -> list | None:
    """Message content as a list of blocks (a string is one text block), or
    None for a shape we do not touch."""
    if isinstance(content, str):
        return [{"type": text_type, "text": content}]
    return list(content) if isinstance(content, list) else None


def relocate_git_status(body: dict, api: Api) -> list[Change]:
    """Move a git status paragraph from the system prompt, verbatim, into a
    <system-reminder> text block at the start of the first user message.

    The paragraph runs from a line opening with `gitStatus:` to the end of its
    text block. The first user message becomes a list of blocks (a string is
    its one text block), so the bytes are the same whether Claude Code sends
    that message as a list or, on later turns, as a string."""
    if _first_user_with_blocks(body, api) is None:
        return []
    paragraphs, changes, emptied = [], [], []
    for path, container, key in list(_system_text_places(body, api)):
        text = container[key]
        start = git_status_start(text)
        if start is None:
            continue
        paragraphs.append(text[start:])
        kept = text[:start].rstrip("\n")
        if kept.strip():
            container[key] = kept
        else:
            emptied.append((path, container, key))
        changes.append(Change(GIT_STATUS, path, "git status paragraph taken out"))
    if not paragraphs:
        return []
    _remove_emptied(body, api, emptied)
    messages = conversation(body, api)  # the OpenAI path may have lost an emptied system message
    first_user = _first_user_index(messages)
    text_type = TEXT_TYPE[api]
    reminders = [{"type": text_type, "text": SYSTEM_REMINDER_OPEN + paragraph + SYSTEM_REMINDER_CLOSE} for paragraph in paragraphs]
    messages[first_user] = {**messages[first_user], "content": reminders + _as_blocks(messages[first_user]["content"], text_type)}
    return changes + [Change(GIT_STATUS, f"{CONVERSATION_KEY[api]}[{first_user}]", "git status paragraph put first, in a <system-reminder>")]


def relocate_conversation_context(body: dict, api: Api) -> list[Change]:
    """Move conversation context into <system-reminder> text blocks of the first
    user message, after the other reminders it starts with: from the system
    prompt verbatim (`conversation_context_spans`: opencode's date line, Qwen
    Code's git snapshot and memory section), and from the first message itself
    (Qwen Code's startup context), the least volatile first.

    Each changes between conversations (a day, a commit, a saved memory) and
    sat before the tools or before reminders that never change, so a new
    conversation re-read all of those; where it lands, system prompt, tools and
    the agent's fixed reminders stay shared."""
    if _first_user_with_blocks(body, api) is None:
        return []
    text_type = TEXT_TYPE[api]
    pieces, changes, emptied = [], [], []
    for path, container, key in list(_system_text_places(body, api)):
        text = container[key]
        spans = conversation_context_spans(text)
        if not spans:
            continue
        pieces += [(what, {"type": text_type, "text": SYSTEM_REMINDER_OPEN + text[start:end].rstrip("\n") + SYSTEM_REMINDER_CLOSE})
                   for start, end, what in spans]
        kept = _without_spans(text, spans)
        if kept.strip():
            container[key] = kept
        else:
            emptied.append((path, container, key))
        changes.append(Change(CONVERSATION_CONTEXT, path, ", ".join(what for _, _, what in spans) + " taken out"))
    _remove_emptied(body, api, emptied)
    messages = conversation(body, api)  # the OpenAI path may have lost an emptied system message
    first_user = _first_user_index(messages)
    content = _as_blocks(messages[first_user]["content"], text_type)
    startup = [block for block in content if _is_startup_context(block)]
    if not pieces and not startup:
        return []
    pieces += [(STARTUP_CONTEXT[0], block) for block in startup]
    messages[first_user] = {**messages[first_user], "content": [block for block in content if not _is_startup_context(block)]}
    _insert_after_leading_reminders(messages, first_user, [block for _, block in sorted(pieces, key=lambda piece: _context_rank(piece[0]))],
                                    text_type)
    if messages[first_user]["content"] == content and not changes:
        return []  # the startup context was already where it goes
    return changes + [Change(CONVERSATION_CONTEXT, f"{CONVERSATION_KEY[api]}[{first_user}]", "conversation context put after its leading reminders, in a <system-reminder>")]


def pin_turn_reminders(body: dict, api: Api) -> list[Change]:
    """Move the turn reminders (`TURN_REMINDER_OPENINGS`) of every user
    message to the first user message, after the other reminders it starts
    with (an identical one only once).

    The agent sends each on its newest message only (Qwen Code: on the newest
    one the user typed): the next request has that message without it, so a
    prefix cache re-reads everything from there, the whole last turn with its
    tool calls and results. In the first message the same text sits in the
    same place on every request, and moves only when it changes (the date at
    midnight, a switch of mode). A later message that holds nothing else is
    left as it is."""
    first_user = _first_user_with_blocks(body, api)
    if first_user is None:
        return []
    messages, key = conversation(body, api), CONVERSATION_KEY[api]
    first_before = messages[first_user]
    moved: dict[str, dict] = {}
    changes = []
    for index, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) and message.get("role") == "user" else None
        if not isinstance(content, list):
            continue
        reminders = [part for part in content if turn_reminder_name(part)]
        rest = [part for part in content if not turn_reminder_name(part)]
        if not reminders or (not rest and index != first_user):
            continue
        messages[index] = {**message, "content": rest}
        moved.update((part["text"], part) for part in reminders if part["text"] not in moved)
        if index != first_user:
            names = ", ".join(dict.fromkeys(map(turn_reminder_name, reminders)))
            changes.append(Change(TURN_REMINDERS, f"{key}[{index}]", f"{names} reminder moved to {key}[{first_user}], after its leading reminders"))
    if not moved:
        return []
    _insert_after_leading_reminders(messages, first_user, list(moved.values()), TEXT_TYPE[api])
    if not changes and messages[first_user] != first_before:
        changes.append(Change(TURN_REMINDERS, f"{key}[{first_user}]", "turn reminder put after the leading reminders"))
    return changes


def lead_with_stable_context(body: dict, api: Api) -> list[Change]:
    """Move the `role:"system"` messages found before any assistant message
    (initial context), rewritten as user <system-reminder> messages, to just
    before the first user message, in their order. Those appended later stay
    where they are (`rewrite_system_messages`). On the OpenAI and Responses
    paths the leading system messages are the system prompt and stay."""
    messages = conversation(body, api)
    if messages is None:
        return []
    first_user = _first_user_index(messages)
    if first_user is None:
        return []
    first_assistant = next((i for i, m in enumerate(messages) if _is_model_output(m, api)), len(messages))
    roles = HOISTED_ROLES[api]
    moved: list[tuple[int, dict]] = []
    for index in range(_leading_count(body, api, responses_input.SYSTEM_ROLES), first_assistant):
        message = messages[index]
        if _is_message(message, api) and message.get("role") in roles:
            wrapped = _wrap_reminder(message.get("content"), TEXT_TYPE[api])
            if wrapped is not None:
                moved.append((index, {**message, "role": "user", "content": wrapped}))
    if not moved:
        return []
    moved_indexes = {index for index, _ in moved}
    rest = [message for index, message in enumerate(messages) if index not in moved_indexes]
    insert_at = _first_user_index(rest)
    key = CONVERSATION_KEY[api]
    body[key] = rest[:insert_at] + [message for _, message in moved] + rest[insert_at:]
    detail = "initial system message moved before the first user message, as user <system-reminder>"
    return [Change(INITIAL_CONTEXT, f"{key}[{index}]", detail) for index, _ in moved]


def _is_model_output(message: Any, api: Api) -> bool:
    if api == "responses":
        return responses_input.is_model_output(message)
    return isinstance(message, dict) and message.get("role") == "assistant"


# --- loaded (deferred) tools ----------------------------------------------------


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


def _tool_schema_line(tool: dict) -> str:
    function = tool["function"] if isinstance(tool.get("function"), dict) else tool
    schema = function.get("parameters", function.get("input_schema", {}))
    entry = {"description": function.get("description", ""), "name": _tool_name(tool), "parameters": schema}
    return f"<function>{json.dumps(entry, ensure_ascii=False)}</function>"


def _inlined_content(blocks: list, from_json_string: bool, deferred: dict[str, dict]) -> tuple[Any, list[str]] | None:
    """The tool result's new content, with its references to deferred tools
    replaced by one text block of their schemas, and the names inlined; None
    when it has no such reference or a shape we do not rewrite (a JSON
    string holding anything but text and references we can inline)."""
    names = list(dict.fromkeys(name for name in map(_tool_reference_name, blocks) if name in deferred))
    if not names:
        return None
    if from_json_string and not all(_tool_reference_name(b) in deferred or _is_text_block(b) for b in blocks):
        return None
    text = INLINED_TOOLS_OPEN + "".join(_tool_schema_line(deferred[name]) + "\n" for name in names) + INLINED_TOOLS_CLOSE
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
    """Take each deferred tool that a `tool_reference` loaded out of `tools`
    and write its schema, as text, into the tool result in place of the
    reference: `tools` stays what the conversation started with, and the tool
    result, once written, reads the same on every later turn. A reference we
    cannot rewrite leaves its tool in `tools`. Deferred tools no reference
    loads go last (`_unloaded_last`)."""
    tools = body.get("tools")
    if not isinstance(tools, list):
        return []
    deferred = {_tool_name(tool): tool for tool in tools if _tool_name(tool) and _is_deferred(tool, api)}
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
        changes.append(Change(LOADED_TOOLS, f"messages[{index}]", f"schema of {', '.join(names)} written into the tool result that loaded it"))
    kept = [tool for tool in tools if _tool_name(tool) not in inlined]
    if inlined:
        changes.append(Change(LOADED_TOOLS, "tools", f"loaded tool {', '.join(inlined)} taken out of tools"))
    ordered, moved = _unloaded_last(body, api, kept)
    if moved:
        changes.append(Change(LOADED_TOOLS, "tools", f"deferred tool {', '.join(moved)}, loaded by no tool_reference, put last"))
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
    unloaded = {id(tool) for tool in tools if _is_deferred(tool, api) and _tool_name(tool) not in referenced}
    ordered = [tool for tool in tools if id(tool) not in unloaded] + [tool for tool in tools if id(tool) in unloaded]
    moved = [_tool_name(tool) for tool in tools if id(tool) in unloaded] if list(map(id, ordered)) != list(map(id, tools)) else []
    return ordered, moved


def deferred_tool_names(body: dict, api: Api) -> set[str]:
    """Tools that are not part of what a conversation starts with: Anthropic
    tools marked `defer_loading`; on the OpenAI path (where routers drop that
    mark) tools a `tool_reference` loaded."""
    if api == "openai":
        return tool_reference_names(body, api)
    tools = body.get("tools")
    return {_tool_name(tool) for tool in tools if _is_deferred(tool, api)} if isinstance(tools, list) else set()


def inlined_tool_names(body: dict, api: Api) -> set[str]:
    """Names of the tools whose schemas `inline_loaded_tools` wrote into tool
    results: they are offered as much as those in `tools`."""
    names = set()
    for _, holder, key in _tool_results(body, api):
        for text in _texts(holder[key]):
            if text.startswith(INLINED_TOOLS_OPEN):
                names |= {name for name in map(_inlined_function_name, _INLINED_FUNCTION.findall(text)) if name}
    return names


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    return [block["text"] for block in content if _is_text_block(block)] if isinstance(content, list) else []


def _inlined_function_name(entry_json: str) -> str | None:
    try:
        entry = json.loads(entry_json)
    except ValueError:
        return None
    return entry.get("name") if isinstance(entry, dict) and isinstance(entry.get("name"), str) else None


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
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > cap:
            changes.append(Change(MAX_TOKENS, key, f"{value} -> {cap}"))
            body[key] = cap
    return changes


def fit_strict_router(body: dict, api: Api) -> list[Change]:
    """What a strict router refuses or rewrites, made to change nothing the engine reads (the module docstring)."""
    if api == "responses":
        return _fit_strict_responses(body)
    if api != "anthropic":
        return []
    changes = []
    for index, message in enumerate(body.get("messages") or []):
        if not isinstance(message, dict):
            continue
        extra = [field for field in message if field not in STRICT_ROUTER_MESSAGE_FIELDS]
        for field in extra:
            del message[field]
        if extra:
            changes.append(Change(STRICT_ROUTER, f"messages[{index}]", f"dropped {', '.join(extra)} (the engine reads role and content only)"))
    thinking, max_tokens = body.get("thinking"), body.get("max_tokens")
    budget = thinking.get("budget_tokens") if isinstance(thinking, dict) else None
    if isinstance(budget, int) and isinstance(max_tokens, int) and budget >= max_tokens:
        del body["thinking"]
        changes.append(Change(STRICT_ROUTER, "thinking", f"dropped (budget_tokens {budget} >= max_tokens {max_tokens}; the engine ignores thinking)"))
    return changes


def _fit_strict_responses(body: dict) -> list[Change]:
    """Fields smg refuses that the engine ignores go (Codex's `client_metadata`); one the engine reads stays,
    refused or not; a missing temperature becomes the engine's own default (smg would set 1.0)."""
    changes = []
    ignored = [field for field in body if field not in STRICT_ROUTER_RESPONSES_FIELDS and field not in ENGINE_RESPONSES_FIELDS]
    for field in ignored:
        del body[field]
    if ignored:
        changes.append(Change(STRICT_ROUTER, ignored[0] if len(ignored) == 1 else "body",
                              f"dropped {', '.join(ignored)} (smg refuses it, the engine ignores it)"))
    if "temperature" not in body:
        body["temperature"] = ENGINE_DEFAULT_TEMPERATURE
        changes.append(Change(STRICT_ROUTER, "temperature", f"set to the engine's default {ENGINE_DEFAULT_TEMPERATURE} (smg would set 1.0)"))
    return changes


_PROMPT_RULE_FUNCTIONS = {
    BILLING_HEADER: strip_billing_header,
    GIT_STATUS: relocate_git_status,
    INITIAL_CONTEXT: lead_with_stable_context,
    SYSTEM_MESSAGES: rewrite_system_messages,
    LOADED_TOOLS: inline_loaded_tools,
    CONVERSATION_CONTEXT: relocate_conversation_context,
    TURN_REMINDERS: pin_turn_reminders,
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
    if rules.enabled(STRICT_ROUTER):
        changes += fit_strict_router(body, api)  # after the cap: the thinking budget is checked against what is sent
    return changes


def rule_for_line(line: str) -> str | None:
    """Which line rule would drop this system-prompt line, if any. The
    diagnosis uses it to name the cause of a divergence inside system text."""
    if is_billing_line(line):
        return BILLING_HEADER
    if is_date_line(line):
        return DATE_LINE
    if _DATE_FIELD_LINE.match(line):
        return CONVERSATION_CONTEXT
    return None
