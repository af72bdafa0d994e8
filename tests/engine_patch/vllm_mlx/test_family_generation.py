"""The cached mlx_lm.stream_generate with a tiny model of every family, in
process: on interleaved multi-turn lanes and a new conversation, greedy tokens
equal those of a cold, uncached generation, and every turn after a lane's
first restores at least its previous prompt up to the generation prompt."""

import pytest

from stable_prefix.engine_patch.cache.ram_tier import RamTier
from stable_prefix.engine_patch.vllm_mlx.simple.cached_generation import CachedGeneration
from tests.support.family_chat import ORIGINAL_STREAM_GENERATE, greedy, prompt, resume_position, served
from tests.support.family_models import shared_family_model


@pytest.fixture(scope="module", params=["qwen3_5", *(pytest.param(family, marks=pytest.mark.slow) for family in ("gpt_oss", "gemma3_text", "nemotron_h"))])
def loaded(request):
    return shared_family_model(request.param)


def test_warm_greedy_tokens_equal_cold_ones_on_interleaved_lanes_and_a_new_conversation(loaded):
    model, tokenizer = loaded
    generation = CachedGeneration(ORIGINAL_STREAM_GENERATE, RamTier(budget_bytes=256 * 2**20))
    resume_at: dict[str, int] = {}
    for lane, turns in [("main", 1), ("subagent", 1), ("main", 3), ("subagent", 3), ("main", 5), ("new", 1)]:
        text = prompt(tokenizer, lane, turns)
        warm, reuse = served(generation, model, tokenizer, text)
        assert warm == greedy(ORIGINAL_STREAM_GENERATE, model, tokenizer, text), f"{lane} turn {turns}"
        if lane in resume_at:
            assert reuse.reused >= resume_at[lane], f"{lane} turn {turns} lost its warm prefix"
        resume_at[lane] = resume_position(tokenizer, text)
    assert reuse.reused > 0, "the new conversation did not reuse the shared head"
    assert not generation.unsupported_reasons()
