"""Where each API keeps the parts of a request the rules read and write.

Three APIs: Anthropic messages (`system`, `messages`), OpenAI chat
completions (leading system messages in `messages`) and the Responses API
(`instructions`, leading developer/system items in `input`; its item
vocabulary is `responses_input.py`). The rules (`rules/`) never look at a
body's shape themselves: they ask here for its system text, its conversation,
its first user message, its tools, and write back through the same helpers.
"""

from __future__ import annotations

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
# How the rules wrap what they move into a user message (the agents' own wrapper for context).
SYSTEM_REMINDER_OPEN = "<system-reminder>\n"
SYSTEM_REMINDER_CLOSE = "\n</system-reminder>"


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


def is_message(item: Any, api: Api) -> bool:
    return responses_input.is_message(item) if api == "responses" else isinstance(item, dict)


def is_model_output(message: Any, api: Api) -> bool:
    if api == "responses":
        return responses_input.is_model_output(message)
    return isinstance(message, dict) and message.get("role") == "assistant"


def leading_count(body: dict, api: Api, roles: tuple[str, ...]) -> int:
    """How many messages at the start are the system prompt proper (OpenAI's
    leading system messages, Responses' leading developer/system items). On
    the Responses path a request that continues a stored response
    (`previous_response_id`) has none: the server puts the history first."""
    messages = conversation(body, api)
    if api == "anthropic" or messages is None or (api == "responses" and body.get("previous_response_id")):
        return 0
    count = 0
    while count < len(messages) and is_message(messages[count], api) and messages[count].get("role") in roles:
        count += 1
    return count


def is_text_block(item: Any) -> bool:
    """A text block (Anthropic, OpenAI) or text part (Responses: input_text, output_text)."""
    return isinstance(item, dict) and item.get("type") in TEXT_PART_TYPES and isinstance(item.get("text"), str)


def is_reminder_block(block: Any) -> bool:
    return is_text_block(block) and block["text"].startswith("<system-reminder>")


def reminder_block(text: str, text_type: str) -> dict:
    """A text block holding `text` wrapped in <system-reminder>, as the rules write what they move."""
    return {"type": text_type, "text": SYSTEM_REMINDER_OPEN + text + SYSTEM_REMINDER_CLOSE}


def texts(content: Any) -> list[str]:
    """The texts of a message's (or tool result's) content: a string is its one text."""
    if isinstance(content, str):
        return [content]
    return [block["text"] for block in content if is_text_block(block)] if isinstance(content, list) else []


# --- the system text ----------------------------------------------------------


def system_text_places(body: dict, api: Api):
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
                if is_text_block(block):
                    yield f"system[{index}]", block, "text"
        return
    if api == "responses" and isinstance(body.get("instructions"), str):
        yield "instructions", body, "instructions"
    messages, key = conversation(body, api), CONVERSATION_KEY[api]
    # only the leading system messages form the system prompt
    for index in range(leading_count(body, api, responses_input.SYSTEM_ROLES)):
        message = messages[index]
        content = message.get("content")
        if isinstance(content, str):
            yield f"{key}[{index}].content", message, "content"
        elif isinstance(content, list):
            for part_index, part in enumerate(content):
                if is_text_block(part):
                    yield f"{key}[{index}].content[{part_index}]", part, "text"


def system_texts(body: dict, api: Api) -> list[str]:
    """The pieces of system-prompt text, in order (for lane signatures)."""
    return [container[key] for _, container, key in system_text_places(body, api)]


def drop_lines(text: str, is_volatile) -> tuple[str, int]:
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


def take_from_system_text(body: dict, api: Api, take) -> list[tuple[str, Any, bool]]:
    """Cut pieces out of each piece of system text: `take(text)` gives (the text kept, what was
    taken), or None to leave it. A piece left blank goes (`remove_emptied`). Returns (path, what was
    taken, whether the piece went) for each piece something was taken from, in order."""
    taken, emptied = [], []
    for path, container, key in list(system_text_places(body, api)):
        found = take(container[key])
        if found is None:
            continue
        kept, pieces = found
        if kept.strip():
            container[key] = kept
        else:
            emptied.append((path, container, key))
        taken.append((path, pieces, not kept.strip()))
    remove_emptied(body, api, emptied)
    return taken


def remove_emptied(body: dict, api: Api, emptied: list[tuple[str, Any, str]]) -> None:
    """Remove the system text places (as `system_text_places` yields them) a rule left empty."""
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


# --- the first user message ---------------------------------------------------


def first_user_index(messages: list) -> int | None:
    return next((i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"), None)


def as_blocks(content: Any, text_type: str = "text") -> list | None:
    """Message content as a list of blocks (a string is one text block), or
    None for a shape we do not touch."""
    if isinstance(content, str):
        return [{"type": text_type, "text": content}]
    return list(content) if isinstance(content, list) else None


def first_user_with_blocks(body: dict, api: Api) -> int | None:
    """The index of the first user message, when its content can take text blocks (a string or a list)."""
    messages = conversation(body, api)
    first_user = first_user_index(messages) if messages is not None else None
    return first_user if first_user is not None and as_blocks(messages[first_user].get("content")) is not None else None


# --- tools --------------------------------------------------------------------


def tool_name(tool: Any) -> str:
    """A tool's name: Anthropic's and Responses' at the top, OpenAI's under `function`; "" for none."""
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
    return [tool_name(tool) for tool in tools] if isinstance(tools, list) else []
