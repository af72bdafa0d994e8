"""Tool calls that the model wrote as text become real tool calls.

    mitmdump --mode reverse:http://127.0.0.1:8000 --listen-host 127.0.0.1 -s addons/toolcall_stream.py

When a request to `/v1/messages` or `/v1/chat/completions` offered tools and
the model answers with `<tool_call>{...}</tool_call>` (or a ```json block) as
text, the client gets a `tool_use` block / `tool_calls` entry instead, so Claude
Code runs the tool rather than printing JSON. Streamed answers are rewritten as
they pass (`flow.response.stream` is set to a transforming callable): text goes
on at once, only a call is held until it is complete. Non-streamed JSON answers
are rewritten whole. Answers that already carry structured tool calls, and
requests that offered no tools, are left alone.

Load it after addons that also stream responses (e.g. strip_billing.py): it
wraps a transforming callable set before it, and takes over a plain
`stream = True`. An addon loaded later that sets `stream` unconditionally would
undo it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable

from mitmproxy import ctx, exceptions, http

from stable_prefix.addons import toolcall_anthropic, toolcall_openai
from stable_prefix.addons.request_body import LeftAlone, api_of, read_json_body
from stable_prefix.addons.rules.loaded_tools import inlined_tool_names
from stable_prefix.addons.text_tool_calls import SYNTAXES

logger = logging.getLogger(__name__)

MARKER = ":wrench:"

StreamCallable = Callable[[bytes], "bytes | Iterable[bytes]"]
StreamRewriter = toolcall_anthropic.AnthropicStreamRewriter | toolcall_openai.OpenAIStreamRewriter


def offered_tools(api: str, request: http.Request) -> frozenset[str]:
    """Tool names the request offered; empty if none, or if the body cannot be read.
    A tool whose schema the inline_loaded_tools rule moved from `tools` into a
    tool result is offered as well."""
    body = read_json_body(request)
    if isinstance(body, LeftAlone):
        return frozenset()
    module = toolcall_anthropic if api == "anthropic" else toolcall_openai
    offered = module.offered_tool_names(body)
    return offered | inlined_tool_names(body, api) if offered else offered


def parse_syntaxes(value: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in value.split(",") if name.strip())
    unknown = [name for name in names if name not in SYNTAXES]
    if unknown or not names:
        raise exceptions.OptionsError(
            f"toolcall_stream_syntaxes: {value!r} is not a comma-separated list of {', '.join(SYNTAXES)}"
        )
    return names


def as_chunks(result: bytes | Iterable[bytes]) -> list[bytes]:
    """A stream callable's result as a list of non-empty chunks (an empty chunk would end a chunked body)."""
    chunks = [result] if isinstance(result, bytes) else list(result)
    return [chunk for chunk in chunks if chunk]


def chain(first: StreamCallable, second: StreamCallable) -> StreamCallable:
    """Run `second` on what `first` produces; both see the end of the stream (b"")."""

    def both(chunk: bytes) -> list[bytes]:
        out = [piece for middle in as_chunks(first(chunk)) for piece in as_chunks(second(middle))]
        if chunk == b"":
            out += as_chunks(second(b""))
        return out

    return both


def stream_transform(rewriter: StreamRewriter, on_end: Callable[[], None], on_problem: Callable[[str], None]) -> StreamCallable:
    """A `flow.response.stream` callable around a stream rewriter."""
    reported = 0

    def transform(chunk: bytes) -> list[bytes]:
        nonlocal reported
        out = rewriter.feed(chunk) if chunk else rewriter.finish()
        for problem in rewriter.problems[reported:]:
            on_problem(problem)
        reported = len(rewriter.problems)
        if not chunk:
            on_end()
        return [out] if out else []

    return transform


def note(flow: http.HTTPFlow, text: str) -> None:
    flow.comment = f"{flow.comment}\n{text}" if flow.comment else text
    flow.marked = flow.marked or MARKER  # another addon's mark (a broken prefix...) says more


class ToolCallStream:
    def __init__(self) -> None:
        self.syntaxes: tuple[str, ...] = SYNTAXES

    def load(self, loader) -> None:
        loader.add_option(
            "toolcall_stream",
            bool,
            True,
            "Turn tool calls that the model wrote as text (<tool_call> tags, ```json blocks) into real "
            "tool_use blocks / tool_calls, in streamed and non-streamed responses.",
        )
        loader.add_option(
            "toolcall_stream_syntaxes",
            str,
            ",".join(SYNTAXES),
            "Comma-separated text syntaxes recognised as tool calls: hermes (<tool_call>...</tool_call>), "
            "json_fence (```json ... ```).",
        )

    def configure(self, updated) -> None:
        if "toolcall_stream_syntaxes" in updated:
            self.syntaxes = parse_syntaxes(ctx.options.toolcall_stream_syntaxes)

    def _applies(self, flow: http.HTTPFlow) -> tuple[str, frozenset[str]] | None:
        if not ctx.options.toolcall_stream or flow.response is None or flow.response.status_code != 200:
            return None
        api = api_of(flow.request)
        if api not in ("anthropic", "openai"):  # the Responses API's events have no rewriter here
            return None
        tools = offered_tools(api, flow.request)
        return (api, tools) if tools else None

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        applies = self._applies(flow)
        response = flow.response
        if applies is None or not response.headers.get("content-type", "").startswith("text/event-stream"):
            return
        encoding = response.headers.get("content-encoding", "identity").lower()
        if encoding != "identity":
            logger.warning(
                f"toolcall_stream: {flow.request.path} streams with content-encoding {encoding!r}; "
                "text tool calls in it are passed through unconverted"
            )
            return
        api, tools = applies
        rewriter = (
            toolcall_anthropic.AnthropicStreamRewriter(tools, self.syntaxes)
            if api == "anthropic"
            else toolcall_openai.OpenAIStreamRewriter(tools, self.syntaxes)
        )

        def on_problem(problem: str) -> None:
            logger.warning(f"toolcall_stream: {flow.request.path}: {problem}")
            note(flow, f"toolcall_stream: {problem}")

        def on_end() -> None:
            if rewriter.calls_converted:
                summary = f"toolcall_stream: {rewriter.calls_converted} text tool call(s) turned into structured calls"
                if rewriter.duplicates_dropped:
                    summary += f"; {rewriter.duplicates_dropped} repeat(s) of them the server sent as well were dropped"
                logger.info(f"{summary} ({flow.request.path})")
                note(flow, summary)

        ours = stream_transform(rewriter, on_end, on_problem)
        previous = response.stream
        response.stream = chain(previous, ours) if callable(previous) else ours
        # The body changes length as it is rewritten.
        if "content-length" in response.headers:
            del response.headers["content-length"]
            if response.http_version == "HTTP/1.1":
                response.headers["transfer-encoding"] = "chunked"

    def response(self, flow: http.HTTPFlow) -> None:
        applies = self._applies(flow)
        if applies is None or flow.response.stream or "json" not in flow.response.headers.get("content-type", ""):
            return
        api, tools = applies
        try:
            body = json.loads(flow.response.content or b"")
        except ValueError:
            return
        if not isinstance(body, dict):
            return
        if api == "anthropic":
            rewritten, calls, problems = toolcall_anthropic.rewrite_message(body, tools, self.syntaxes)
        else:
            rewritten, calls, problems = toolcall_openai.rewrite_completion(body, tools, self.syntaxes)
        for problem in problems:
            logger.warning(f"toolcall_stream: {flow.request.path}: {problem}")
            note(flow, f"toolcall_stream: {problem}")
        if rewritten is not None:
            flow.response.content = json.dumps(rewritten, ensure_ascii=False).encode()
            summary = f"toolcall_stream: {calls} text tool call(s) turned into structured calls"
            logger.info(f"{summary} ({flow.request.path})")
            note(flow, summary)


addons = [ToolCallStream()]
