"""The chat-completions form of a session request, as a plain translating proxy sends it."""

import json

from stable_prefix.bench.workload.openai_form import openai_body
from stable_prefix.bench.workload.session import generate_session


def test_translation_keeps_every_message_in_place_and_normalizes_nothing():
    session = generate_session(seed=2, scale=0.05)
    main = [r for r in session if r.lane == "main"][3].body
    converted = openai_body(main, max_tokens=8)
    assert "model" not in converted and converted["max_tokens"] == 8 and converted["stream_options"] == {"include_usage": True}
    assert converted["messages"][0]["role"] == "system"
    assert converted["messages"][0]["content"].startswith("x-anthropic-billing-header: cc_version=")
    assert converted["messages"][2]["role"] == "system"  # the reminder after the first user message stays there
    calls = [call for m in converted["messages"] if m["role"] == "assistant" for call in m.get("tool_calls", [])]
    results = [m for m in converted["messages"] if m["role"] == "tool"]
    assert calls and [c["id"] for c in calls] == [r["tool_call_id"] for r in results]
    assert all(isinstance(json.loads(c["function"]["arguments"]), dict) for c in calls)
    assert [t["function"]["name"] for t in converted["tools"]] == [t["name"] for t in main["tools"]]


def test_a_request_without_tools_has_none():
    title = next(r for r in generate_session(seed=2, scale=0.05) if r.lane == "title").body
    converted = openai_body(title, max_tokens=8)
    assert "tools" not in converted
    assert [m["role"] for m in converted["messages"]] == ["system", "user"]
