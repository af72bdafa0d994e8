"""A streamed answer with tools loses none of its text to vllm-mlx's auto tool parser.

vllm-mlx 0.6.0 streams every request that has `tools` (unless `tool_choice` is "none") through a fresh parser from
`server._get_streaming_tool_parser`: `/v1/chat/completions`, `/v1/messages` and `/v1/responses` alike. Without
`--tool-call-parser` (our default) that is `AutoToolParser`, whose legacy branch returns nothing for every delta once
the text holds both "<" and "[" anywhere (a tool call might be starting) and never gives that text back: its
`finalize_streaming` releases only what its DSML branch held. `Compare a < b first, then read arr[0] and print it.`
streams as `Compare a < b first, then read arr`; the tokens, `usage` and the answer not streamed are whole.

The seam wraps that parser, request by request (`ReleasingToolParser`). Its text is released as the raw text itself,
up to where a tool call could be opening (one of the openings AutoToolParser parses, or the start of one at the end
of the text); that tail is held until the next delta shows it is prose, a completed call consumes it, or the
stream ends (then all of it goes out). The parser is still asked every delta and decides what a call is: its calls
pass through, with the prose before a call's opening as their content and the call's markup dropped. So the
concatenated streamed text is the streamed text without tools, byte for byte, and the answer not streamed up to its
surrounding whitespace (vllm-mlx strips that there).

Upstream: no fix found (searched vllm-mlx's issues and code, 2026-12-04; the stored waybarrios/vllm-mlx
`auto_tool_parser.py` at 042acc0 predates the DSML branch and withholds from any "<tool_call>"-like marker in the
same way). A parser named by `--tool-call-parser` is left as vllm-mlx ships it.
"""

from __future__ import annotations

import functools
import logging
import re
from typing import Any

logger = logging.getLogger("engine_patch")

# The openings of the call formats AutoToolParser streams (its docstring's list): Gemma 4, DeepSeek-V4's DSML block,
# Mistral, Qwen's bracket, Qwen/Hermes and Nemotron XML, Llama.
CALL_OPENINGS = ("<|tool_call>", "<｜DSML｜tool_calls>", "[TOOL_CALLS]", "[Calling tool:", "<tool_call>", "<function=")
# A bare bracket call, `[name({...})]`, and what may still grow into one at the end of the text.
BARE_BRACKET_OPENING = re.compile(r"\[\w+\(\{")
BARE_BRACKET_OPENING_AT_END = re.compile(r"\[\w*\(?$")
# Where each format's call ends (AutoToolParser's end markers and the DSML block's).
CALL_ENDINGS = ("<tool_call|>", "</tool_call>", "</function>", ")]", "</｜DSML｜tool_calls>")

PATCHED = "tool-call streams release withheld text"


def call_opening_at(text: str, start: int) -> int:
    """The first index from `start` at which `text` holds a call's opening or, at its end, the start of one;
    `len(text)` when there is none (all of `text[start:]` is prose)."""
    found = [len(text)]
    for opening in CALL_OPENINGS:
        index = text.find(opening, start)
        if index >= 0:
            found.append(index)
        for size in range(min(len(opening) - 1, len(text) - start), 0, -1):
            if text.endswith(opening[:size]):
                found.append(len(text) - size)
                break
    for pattern in (BARE_BRACKET_OPENING, BARE_BRACKET_OPENING_AT_END):
        match = pattern.search(text, start)
        if match:
            found.append(match.start())
    return min(found)


def call_end_after(text: str, start: int) -> int:
    """Where the last call that opened at or after `start` ends: after its last end marker (the whole text if none)."""
    ends = [text.rfind(ending) + len(ending) for ending in CALL_ENDINGS if text.rfind(ending) >= start]
    return max(ends, default=len(text))


class ReleasingToolParser:
    """One request's streaming tool parser whose withheld text always comes back, in order.

    Everything but the two streaming calls and `reset` is the wrapped parser's (vllm-mlx reads class flags such as
    `REQUIRES_EAGER_STREAMING` off it)."""

    def __init__(self, parser: Any):
        self._parser = parser
        # How much of the accumulated text has gone out as content or was consumed by a call.
        self._released_to = 0

    def __getattr__(self, name: str) -> Any:
        if name == "_parser":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self._parser, name)

    def reset(self) -> None:
        self._parser.reset()
        self._released_to = 0

    def extract_tool_calls_streaming(self, previous_text: str, current_text: str, delta_text: str, *args: Any,
                                     **kwargs: Any) -> dict[str, Any] | None:
        result = self._parser.extract_tool_calls_streaming(previous_text, current_text, delta_text, *args, **kwargs)
        if result is not None and result.get("tool_calls"):
            return self._with_call(current_text, result)
        held_from = call_opening_at(current_text, self._released_to)
        return self._release(current_text, held_from)

    def finalize_streaming(self, current_text: str) -> dict[str, Any] | None:
        finalize = getattr(self._parser, "finalize_streaming", None)
        result = finalize(current_text) if finalize is not None else None
        if result is not None and result.get("tool_calls"):
            return self._with_call(current_text, result)
        return self._release(current_text, len(current_text))

    def _release(self, current_text: str, upto: int) -> dict[str, Any] | None:
        if upto <= self._released_to:
            return None
        content = current_text[self._released_to : upto]
        self._released_to = upto
        return {"content": content}

    def _with_call(self, current_text: str, result: dict[str, Any]) -> dict[str, Any]:
        opening = call_opening_at(current_text, self._released_to)
        # A call whose opening was not held (a format AutoToolParser streams but CALL_OPENINGS lacks) went out as
        # text already; only the calls are added.
        prose = current_text[self._released_to : opening] if opening < len(current_text) else ""
        self._released_to = max(self._released_to, call_end_after(current_text, opening))
        return {"tool_calls": result["tool_calls"], "content": prose}


def install() -> list[str]:
    """Wrap every streamed request's auto tool parser; a no-op (logged) where vllm-mlx has no such seam."""
    from vllm_mlx import server
    from vllm_mlx.tool_parsers.auto_tool_parser import AutoToolParser

    get_parser = getattr(server, "_get_streaming_tool_parser", None)
    if get_parser is None:
        logger.warning("engine_patch: vllm-mlx has no _get_streaming_tool_parser; streamed text with tools left as shipped")
        return []
    if getattr(get_parser, "releases_withheld_text", False):
        return [PATCHED]

    @functools.wraps(get_parser)
    def get_releasing_parser(*args: Any, **kwargs: Any):
        parser = get_parser(*args, **kwargs)
        return ReleasingToolParser(parser) if isinstance(parser, AutoToolParser) else parser

    get_releasing_parser.releases_withheld_text = True  # type: ignore[attr-defined]
    server._get_streaming_tool_parser = get_releasing_parser
    return [PATCHED]
