"""Agent-shaped conversations on three lanes (a main agent with two tools, a search subagent with one, a title
request with none), three turns each, each turn extending the last, in both protocols; `interleaved` sends them
as an agent does, lanes alternating, streamed and not. The patched server's tests and its model families' run them.
"""

from __future__ import annotations

import copy

MAX_TOKENS = 8

READ_FILE = {"name": "read_file", "description": "Read a file.", "input_schema": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
RUN = {"name": "run", "description": "Run a shell command.", "input_schema": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}

LANES = {
    "main": ("You are the main coding agent. Work step by step.", [READ_FILE, RUN]),
    "subagent": ("You are a search subagent. Report file paths only.", [READ_FILE]),
    "title": ("Write a five-word title for the conversation.", []),
}


def anthropic_turns(lane: str) -> list[dict]:
    """Requests of one lane, each extending the previous one's messages."""
    system, tools = LANES[lane]
    base = {"model": "tiny", "max_tokens": MAX_TOKENS, "temperature": 0, "system": [{"type": "text", "text": system}]}
    if tools:
        base["tools"] = tools
    messages = [{"role": "user", "content": f"[{lane}] What does src/app.py do?"}]
    turns = [{**base, "messages": copy.deepcopy(messages)}]
    messages += [
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me read it."},
            {"type": "tool_use", "id": "toolu_01", "name": "read_file", "input": {"path": "src/app.py"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01", "content": "def handler(request):\n    return service(request)\n"}]},
    ]
    turns.append({**base, "messages": copy.deepcopy(messages)})
    messages += [
        {"role": "assistant", "content": [{"type": "text", "text": "It forwards the request to the service."}]},
        {"role": "user", "content": "Thanks. Now check the tests."},
    ]
    turns.append({**base, "messages": copy.deepcopy(messages), "stop_sequences": ["\n\nHuman:"], "top_k": 40})
    return turns


def openai_turns(lane: str) -> list[dict]:
    system, tools = LANES[lane]
    base = {"model": "tiny", "max_tokens": MAX_TOKENS, "temperature": 0}
    if tools:
        base["tools"] = [{"type": "function", "function": {
            "name": tool["name"], "description": tool["description"], "parameters": tool["input_schema"]}} for tool in tools]
    messages = [{"role": "system", "content": system}, {"role": "user", "content": f"[{lane}] What does src/app.py do?"}]
    turns = [{**base, "messages": copy.deepcopy(messages)}]
    messages += [
        {"role": "assistant", "content": "Let me read it.", "tool_calls": [{"id": "call_01", "type": "function", "function": {
            "name": "read_file", "arguments": "{\"path\": \"src/app.py\"}"}}]},
        {"role": "tool", "tool_call_id": "call_01", "content": "def handler(request):\n    return service(request)\n"},
    ]
    turns.append({**base, "messages": copy.deepcopy(messages)})
    messages += [
        {"role": "assistant", "content": "It forwards the request to the service."},
        {"role": "user", "content": "Thanks. Now check the tests."},
    ]
    turns.append({**base, "messages": copy.deepcopy(messages), "stop": ["\n\nUser:"], "top_k": 40, "presence_penalty": 0.5})
    return turns


PROTOCOLS = {"/v1/messages": anthropic_turns, "/v1/chat/completions": openai_turns}


def interleaved(path: str) -> list[tuple[str, dict]]:
    """main, subagent and title requests interleaved, streamed and not."""
    turns = {lane: PROTOCOLS[path](lane) for lane in LANES}
    order = [("main", 0), ("subagent", 0), ("main", 1), ("title", 0), ("subagent", 1), ("main", 2), ("subagent", 2)]
    sequence = []
    for index, (lane, turn) in enumerate(order):
        body = {**turns[lane][turn], "stream": index % 2 == 1}
        sequence.append((lane, body))
    return sequence
