"""Streamed answers of the three protocols, written by us in the shapes the engine sends, to cut at every byte.

Each answer is thinking (reasoning), text and a tool call with JSON arguments, with multi-byte characters in
all three (2-, 3- and 4-byte UTF-8), as a list of tokens. `chat_stream`, `anthropic_stream` and
`responses_stream` write the tokens as that protocol's event stream, `per_event` tokens to an event (a replay
of the same greedy answer may group its tokens otherwise: a batched engine merges outputs when the stream
lags, a drafted step sends its accepted run in one event), with the ids the server would draw for that
answer. `answer_of_chat` reads a chat completion stream back into the message it carries.
"""

from __future__ import annotations

from dataclasses import dataclass

from stable_prefix.addons.sse_events import SSEParser, format_event

REASONING = ["Let", " me", " think", ":", " the", " naïve", " cache", " reads", " ünïcode", "…"]
CONTENT = ["Voilà", ":", " the", " cache", " keeps", " 日本", "語", " and", " 🚀", " emoji", "."]
TOOL_NAME = "read"
ARGUMENTS = ['{"', "path", '":', ' "', "src/", "café", "_日本", ".py", '"}']
PROMPT_TOKENS = 57
TOKENS = len(REASONING) + len(CONTENT) + len(ARGUMENTS)


@dataclass(frozen=True)
class Ids:
    answer: str = "first"
    call: str = "1"
    created: int = 100


def _groups(tokens: list[str], per_event: int) -> list[str]:
    return ["".join(tokens[start : start + per_event]) for start in range(0, len(tokens), per_event)]


# --- OpenAI chat completions ------------------------------------------------------------------------------------


def chat_stream(ids: Ids = Ids(), per_event: int = 1, usage: bool = True) -> bytes:
    envelope = {"id": f"chatcmpl-{ids.answer}", "object": "chat.completion.chunk", "created": ids.created, "model": "tiny"}

    def chunk(delta: dict | None, finish: str | None = None, **extra) -> bytes:
        choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
        return format_event({**envelope, "choices": choices, **extra})

    events = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"reasoning_content": text}) for text in _groups(REASONING, per_event)]
    events += [chunk({"content": text}) for text in _groups(CONTENT, per_event)]
    arguments = _groups(ARGUMENTS, per_event)
    events.append(chunk({"tool_calls": [{"index": 0, "id": f"call_{ids.call}", "type": "function",
                                         "function": {"name": TOOL_NAME, "arguments": arguments[0]}}]}))
    events += [chunk({"tool_calls": [{"index": 0, "function": {"arguments": text}}]}) for text in arguments[1:]]
    events.append(chunk({}, "tool_calls"))
    if usage:
        events.append(chunk(None, usage={"prompt_tokens": PROMPT_TOKENS, "completion_tokens": TOKENS, "total_tokens": PROMPT_TOKENS + TOKENS}))
    events.append(format_event("[DONE]"))
    return b"".join(events)


@dataclass
class ChatAnswer:
    """What a client makes of a chat completion stream."""

    ids: set
    roles: int
    reasoning: str
    content: str
    calls: dict  # index -> [ids, name, arguments]
    finish_reasons: list
    usage: dict | None
    done: int
    errors: list


def answer_of_chat(stream: bytes) -> ChatAnswer:
    """The message a chat completion stream carries; AssertionError where an event is malformed."""
    parser = SSEParser()
    events = parser.feed(stream)
    assert parser.finish() == b"", "the stream ends inside an event"
    answer = ChatAnswer(set(), 0, "", "", {}, [], None, 0, [])
    for event in events:
        assert event.data is not None, f"an event that is not UTF-8 or has no data: {event.raw!r}"
        if event.data == "[DONE]":
            answer.done += 1
            continue
        payload = event.json()
        assert isinstance(payload, dict), f"an event that is not JSON: {event.raw!r}"
        if "error" in payload:
            answer.errors.append(payload["error"])
            continue
        assert answer.done == 0, "an event after [DONE]"
        answer.ids.add(payload["id"])
        answer.usage = payload.get("usage") or answer.usage
        for choice in payload["choices"]:
            delta = choice["delta"]
            answer.roles += "role" in delta
            answer.reasoning += delta.get("reasoning_content") or ""
            answer.content += delta.get("content") or ""
            for fragment in delta.get("tool_calls") or []:
                call = answer.calls.setdefault(fragment["index"], [set(), None, ""])
                if "id" in fragment:
                    call[0].add(fragment["id"])
                call[1] = fragment.get("function", {}).get("name") or call[1]
                call[2] += fragment.get("function", {}).get("arguments") or ""
            if choice.get("finish_reason"):
                answer.finish_reasons.append(choice["finish_reason"])
    return answer


# --- Anthropic messages ---------------------------------------------------------------------------------------


def anthropic_stream(ids: Ids = Ids(), per_event: int = 1) -> bytes:
    def event(name: str, payload: dict) -> bytes:
        return format_event({"type": name, **payload}, name)

    events = [event("message_start", {"message": {"id": f"msg_{ids.answer}", "type": "message", "role": "assistant", "model": "tiny",
                                                  "content": [], "stop_reason": None, "usage": {"input_tokens": PROMPT_TOKENS, "output_tokens": 1}}}),
              event("content_block_start", {"index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
              event("ping", {})]
    events += [event("content_block_delta", {"index": 0, "delta": {"type": "thinking_delta", "thinking": text}}) for text in _groups(REASONING, per_event)]
    events += [event("content_block_delta", {"index": 0, "delta": {"type": "signature_delta", "signature": "c2lnbmF0dXJl"}}),
               event("content_block_stop", {"index": 0}),
               event("content_block_start", {"index": 1, "content_block": {"type": "text", "text": ""}})]
    events += [event("content_block_delta", {"index": 1, "delta": {"type": "text_delta", "text": text}}) for text in _groups(CONTENT, per_event)]
    events += [event("content_block_stop", {"index": 1}),
               event("content_block_start", {"index": 2, "content_block": {"type": "tool_use", "id": f"toolu_{ids.call}", "name": TOOL_NAME, "input": {}}})]
    events += [event("content_block_delta", {"index": 2, "delta": {"type": "input_json_delta", "partial_json": text}}) for text in _groups(ARGUMENTS, per_event)]
    events += [event("content_block_stop", {"index": 2}),
               event("message_delta", {"delta": {"stop_reason": "tool_use", "stop_sequence": None}, "usage": {"output_tokens": TOKENS}}),
               event("message_stop", {})]
    return b"".join(events)


# --- the Responses API ------------------------------------------------------------------------------------------


def responses_stream(ids: Ids = Ids(), per_event: int = 1) -> bytes:
    sequence = iter(range(10_000))
    response_id, call_id = f"resp_{ids.answer}", f"call_{ids.call}"

    def event(name: str, **payload) -> bytes:
        return format_event({"type": name, "sequence_number": next(sequence), **payload}, name)

    reasoning = {"id": "rs_1", "type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "".join(REASONING)}]}
    message = {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
               "content": [{"type": "output_text", "text": "".join(CONTENT), "annotations": []}]}
    call = {"id": "fc_1", "type": "function_call", "call_id": call_id, "name": TOOL_NAME, "arguments": "".join(ARGUMENTS), "status": "completed"}
    shell = {"id": response_id, "object": "response", "created_at": ids.created, "model": "tiny", "output": []}
    events = [event("response.created", response={**shell, "status": "in_progress"}),
              event("response.in_progress", response={**shell, "status": "in_progress"}),
              event("response.output_item.added", output_index=0, item={**reasoning, "content": []})]
    events += [event("response.reasoning_text.delta", item_id="rs_1", output_index=0, content_index=0, delta=text) for text in _groups(REASONING, per_event)]
    events += [event("response.output_item.done", output_index=0, item=reasoning),
               event("response.output_item.added", output_index=1, item={**message, "status": "in_progress", "content": []}),
               event("response.content_part.added", item_id="msg_1", output_index=1, content_index=0, part={"type": "output_text", "text": ""})]
    events += [event("response.output_text.delta", item_id="msg_1", output_index=1, content_index=0, delta=text) for text in _groups(CONTENT, per_event)]
    events += [event("response.output_text.done", item_id="msg_1", output_index=1, content_index=0, text="".join(CONTENT)),
               event("response.output_item.done", output_index=1, item=message),
               event("response.output_item.added", output_index=2, item={**call, "arguments": "", "status": "in_progress"})]
    events += [event("response.function_call_arguments.delta", item_id="fc_1", output_index=2, delta=text) for text in _groups(ARGUMENTS, per_event)]
    events += [event("response.function_call_arguments.done", item_id="fc_1", output_index=2, arguments="".join(ARGUMENTS)),
               event("response.output_item.done", output_index=2, item=call),
               event("response.completed", response={**shell, "status": "completed", "output": [reasoning, message, call],
                                                     "usage": {"input_tokens": PROMPT_TOKENS, "output_tokens": TOKENS,
                                                               "total_tokens": PROMPT_TOKENS + TOKENS}})]
    return b"".join(events)
