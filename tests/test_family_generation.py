"""The cached mlx_lm.stream_generate with a tiny model of every family, in
process: on interleaved multi-turn lanes and a new conversation, greedy tokens
equal those of a cold, uncached generation, and every turn after a lane's
first restores at least its previous prompt up to the generation prompt."""

import mlx_lm
import pytest
from mlx_lm.sample_utils import make_sampler

from stable_prefix.engine_patch.cached_generation import CachedGeneration
from stable_prefix.engine_patch.prefix_cache import PrefixCache
from stable_prefix.engine_patch.prompt_boundaries import generation_prompt_start, message_start_ids
from stable_prefix.engine_patch.request_reuse import begin_request, end_request
from tests.support.models import REPO_ROOT, require_model

ORIGINAL_STREAM_GENERATE = mlx_lm.stream_generate
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file.",
                                           "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]
SYSTEM = "You are a careful coding agent. Read before you edit, and say what you changed. " * 4
TURNS = ["Look at src/app.py.", "It parses the request.", "Check the tests too.", "They cover the happy path.", "Add an error test."]


@pytest.fixture(scope="module", params=["qwen3_5", *(pytest.param(family, marks=pytest.mark.slow) for family in ("gpt_oss", "gemma3_text", "nemotron_h"))])
def loaded(request):
    return mlx_lm.load(str(require_model(REPO_ROOT / "build" / f"tiny-{request.param}")))


def prompt(tokenizer, lane: str, turns: int) -> str:
    messages = [{"role": "system", "content": SYSTEM}]
    for index, text in enumerate(TURNS[:turns]):
        messages.append({"role": "user" if index % 2 == 0 else "assistant", "content": f"[{lane}] {text}" if index == 0 else text})
    return tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True)


def greedy(stream_generate, model, tokenizer, text: str) -> list[int]:
    return [response.token for response in stream_generate(model, tokenizer, text, 6, sampler=make_sampler(temp=0.0))]


def test_warm_greedy_tokens_equal_cold_ones_on_interleaved_lanes_and_a_new_conversation(loaded):
    model, tokenizer = loaded
    generation = CachedGeneration(ORIGINAL_STREAM_GENERATE, PrefixCache(budget_bytes=256 * 2**20))
    resume_at: dict[str, int] = {}
    for lane, turns in [("main", 1), ("subagent", 1), ("main", 3), ("subagent", 3), ("main", 5), ("new", 1)]:
        text = prompt(tokenizer, lane, turns)
        reuse, token = begin_request()
        try:
            warm = greedy(generation, model, tokenizer, text)
        finally:
            end_request(token)
        assert warm == greedy(ORIGINAL_STREAM_GENERATE, model, tokenizer, text), f"{lane} turn {turns}"
        if lane in resume_at:
            assert reuse.reused >= resume_at[lane], f"{lane} turn {turns} lost its warm prefix"
        tokens = tokenizer.encode(text, add_special_tokens=False)
        resume_at[lane] = generation_prompt_start(tokens, message_start_ids(tokenizer))
    assert reuse.reused > 0, "the new conversation did not reuse the shared head"
    assert not generation.unsupported_reasons()
