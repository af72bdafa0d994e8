"""Reading what the CLI is given: a capture record or a raw request body."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from stable_prefix.addons.capture import RECORD_FORMAT
from stable_prefix.addons.request_shape import Api


class InputError(Exception):
    """A file the CLI cannot use; the message names the file and the problem."""


@dataclass(frozen=True)
class RequestFile:
    path: Path
    is_capture: bool
    api: Api
    client_body: dict  # as the client sent it (a raw body is taken as that)
    forwarded_body: dict | None  # as the proxy forwarded it; None for raw bodies
    lane: str | None  # as recorded at capture time
    response: dict | None
    headers: dict[str, str] | None = None  # as recorded (credentials redacted); None for raw bodies

    @property
    def label(self) -> str:
        return self.path.stem


def guess_api(body: dict) -> Api:
    """Raw bodies carry no path: Responses bodies have `input` and no
    `messages`; OpenAI bodies have function tools or role:tool messages and no
    top-level `system`."""
    if "input" in body and "messages" not in body:
        return "responses"
    if "system" in body:
        return "anthropic"
    tools = body.get("tools") if isinstance(body.get("tools"), list) else []
    messages = body.get("messages") if isinstance(body.get("messages"), list) else []
    if any(isinstance(t, dict) and t.get("type") == "function" for t in tools) or any(
        isinstance(m, dict) and m.get("role") == "tool" for m in messages
    ):
        return "openai"
    return "anthropic"


def load(path: str | Path) -> RequestFile:
    path = Path(path)
    try:
        document = json.loads(path.read_bytes())
    except OSError as error:
        raise InputError(f"{path}: cannot read it ({error.strerror or error})") from error
    except ValueError as error:
        raise InputError(f"{path}: not valid JSON ({error})") from error
    return parse(path, document)


def parse(path: Path, document: object) -> RequestFile:
    """A file's JSON read as a capture record or a raw request body."""
    if not isinstance(document, dict):
        raise InputError(f"{path}: a JSON {type(document).__name__}, expected a capture record or a request body (an object)")
    if document.get("format") == RECORD_FORMAT:
        client, forwarded = document.get("client_body"), document.get("forwarded_body")
        if not isinstance(client, dict) or not isinstance(forwarded, dict):
            raise InputError(f"{path}: capture record whose request body was not a JSON object; nothing to compare")
        api = (document.get("request") or {}).get("api") or guess_api(client)
        headers = (document.get("request") or {}).get("headers")
        return RequestFile(path, True, api, client, forwarded, document.get("lane"), document.get("response"), headers if isinstance(headers, dict) else None)
    if not isinstance(document.get("messages"), list) and not isinstance(document.get("input"), (str, list)):
        raise InputError(f"{path}: neither a capture record (no \"format\": {RECORD_FORMAT!r}) nor a request body (no \"messages\" list, no Responses \"input\")")
    return RequestFile(path, False, guess_api(document), document, None, None, None)


def files_in(directory: str | Path) -> list[Path]:
    directory = Path(directory)
    if not directory.is_dir():
        raise InputError(f"{directory}: not a directory")
    files = sorted(directory.glob("*.json"))
    if not files:
        sessions = sorted(p.name for p in directory.iterdir() if p.is_dir() and any(p.glob("*.json")))
        hint = f" (sessions in subfolders: {', '.join(sessions[-5:])})" if sessions else ""
        raise InputError(f"{directory}: no .json files{hint}")
    return files
