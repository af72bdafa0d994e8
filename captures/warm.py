"""`stable-prefix warm FILE_OR_DIR... --url URL`: pre-warm a server (also `python -m stable_prefix.engine_patch warm`).

Sends each captured request (a `captures/sessions/...` record, or a raw request
body) to a running server with `max_tokens: 1`, so the server prefills and
keeps its prompt's KV state: right after a start, the next real request of
that agent finds its system + tools prefix (and history) warm. A capture sends
the body the proxy forwarded (what the engine would receive), a raw body is
sent as it is; `--model` overrides the model name (a server answers 404 to
names it does not serve). It replays captures over HTTP and needs nothing of the
engine: any server that answers the Anthropic or OpenAI API can be warmed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from stable_prefix.captures.inputs import InputError, files_in, load

PATHS = {"anthropic": "/v1/messages", "openai": "/v1/chat/completions"}


def warm_body(body: dict, model: str | None) -> dict:
    body = {**body, "max_tokens": 1, "stream": False}
    body.pop("max_completion_tokens", None)
    if model:
        body["model"] = model
    return body


def prompt_and_reused(api: str, usage: dict) -> tuple[int | None, int | None]:
    if api == "anthropic":
        reused = usage.get("cache_read_input_tokens")
        total = usage.get("input_tokens")
        return (None if total is None else total + (reused or 0)), reused
    return usage.get("prompt_tokens"), (usage.get("prompt_tokens_details") or {}).get("cached_tokens")


def send(url: str, path: str, body: dict, timeout: float) -> dict:
    request = urllib.request.Request(url.rstrip("/") + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"content-type": "application/json", "anthropic-version": "2023-06-01"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def request_files(arguments: list[str]) -> list[Path]:
    files: list[Path] = []
    for argument in arguments:
        path = Path(argument)
        files += files_in(path) if path.is_dir() else [path]
    return files


def warm_one(path: Path, url: str, model: str | None, timeout: float) -> str:
    """Send one file's request; the line that reports it. Raises InputError or OSError."""
    request = load(path)
    body = warm_body(request.forwarded_body or request.client_body, model)
    started = time.perf_counter()
    try:
        answer = send(url, PATHS[request.api], body, timeout)
    except urllib.error.HTTPError as error:
        detail = error.read().decode(errors="replace")[:300]
        raise OSError(f"the server answered {error.code}: {detail}") from error
    prompt, reused = prompt_and_reused(request.api, answer.get("usage") or {})
    seconds = time.perf_counter() - started
    return f"warmed {path}: {prompt if prompt is not None else '?'} prompt tokens, {reused if reused is not None else '?'} already cached, {seconds:.2f} s"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="stable-prefix warm", description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", metavar="FILE_OR_DIR", help="capture records or request bodies (.json), or folders of them")
    parser.add_argument("--url", required=True, help="the server's base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", help="send this model name instead of the request's")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per request (a cold prefill can take minutes)")
    arguments = parser.parse_args(argv)
    try:
        files = request_files(arguments.files)
    except InputError as error:
        print(f"warm: {error}", file=sys.stderr)
        return 2
    failures = 0
    for path in files:
        try:
            print(warm_one(path, arguments.url, arguments.model, arguments.timeout), flush=True)
        except InputError as error:
            failures += 1
            print(f"warm: {error}; not warmed", file=sys.stderr, flush=True)
        except (OSError, ValueError) as error:
            failures += 1
            print(f"warm: {path}: not warmed ({error})", file=sys.stderr, flush=True)
    return 1 if failures else 0
