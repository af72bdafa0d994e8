"""A streamed answer with tools from the real patched server has all its text (`http_api/tool_parser_stream.py`).

The failover tiny model (random weights) answers this prompt greedily with a "<" and later a "[": vllm-mlx 0.6.0's
auto tool parser streamed 146 of its 655 characters. Drafting on, as on a Mac (a drafted step's delta carries its
whole run, so the text is split unlike one token a delta). Each protocol's streamed text must be the answer not
streamed, up to the surrounding whitespace vllm-mlx strips there, from as many tokens. (`tool_choice: "none"` is no
reference: it leaves the tools out of the prompt, so the answer differs.)"""

from __future__ import annotations

import pytest

from tests.support.engines import engine
from tests.support.llm_client import send
from tests.support.models import FAILOVER_MODEL

pytestmark = pytest.mark.server

PROMPT = "Describe the tokenizer."
SYSTEM = "You are a coding agent. Answer at length. " * 8
SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}}
GREEDY = {"model": "tiny", "temperature": 0, "max_tokens": 120}
BODIES = {
    "/v1/chat/completions": {**GREEDY, "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPT}],
                             "tools": [{"type": "function", "function": {"name": "read", "description": "Read a file.", "parameters": SCHEMA}}]},
    "/v1/messages": {**GREEDY, "system": SYSTEM, "messages": [{"role": "user", "content": PROMPT}],
                     "tools": [{"name": "read", "description": "Read a file.", "input_schema": SCHEMA}]},
}


def output_tokens(usage: dict) -> int:
    return usage.get("completion_tokens", usage.get("output_tokens"))


@pytest.fixture(scope="module")
def replica(tmp_path_factory):
    with engine(tmp_path_factory.mktemp("engine"), "engine", "--draft", "on", model=FAILOVER_MODEL) as server:
        yield server


@pytest.mark.parametrize("path", BODIES)
def test_a_streamed_answer_with_tools_holding_a_less_than_then_a_bracket_streams_all_its_text(replica, path):
    whole = send(replica.url, path, BODIES[path])
    less_than = whole.text.find("<")
    assert less_than >= 0 and "[" in whole.text[less_than:], "the prompt no longer makes the answer the parser withheld"
    streamed = send(replica.url, path, {**BODIES[path], "stream": True})
    assert streamed.usage == whole.usage or output_tokens(streamed.usage) == output_tokens(whole.usage)
    assert streamed.text.strip() == whole.text.strip()
