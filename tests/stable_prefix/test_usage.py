"""stable_prefix/usage.py: a prompt's size and reuse read from each server's usage, as the protocol defines them.

Anthropic's usage splits the prompt three ways: `input_tokens` (after the last cache breakpoint), `cache_read_input_tokens`
(read from the cache) and `cache_creation_input_tokens` (written to it); the prompt is their sum. vLLM's /v1/messages
answer not streamed reports the tokens it prefilled and cached as created.
"""

from __future__ import annotations

from stable_prefix.usage import prompt_tokens_in_usage, reuse_from_usage, reuse_reported

VLLM_MESSAGES_NOT_STREAMED = {"input_tokens": 12, "cache_creation_input_tokens": 900, "cache_read_input_tokens": 64, "output_tokens": 8}


def test_an_anthropic_prompt_counts_the_tokens_written_to_the_cache_too():
    assert prompt_tokens_in_usage(VLLM_MESSAGES_NOT_STREAMED) == 976


def test_anthropic_reuse_is_read_of_the_whole_prompt_including_the_tokens_written_to_the_cache():
    assert reuse_from_usage(VLLM_MESSAGES_NOT_STREAMED) == (976, 64)
    assert reuse_reported(VLLM_MESSAGES_NOT_STREAMED) == (976, 64)


def test_tokens_written_to_the_cache_and_none_read_are_a_reported_reuse_of_zero():
    assert reuse_from_usage({"input_tokens": 5, "cache_creation_input_tokens": 300, "output_tokens": 1}) == (305, 0)


def test_an_anthropic_usage_without_the_cache_fields_is_its_input_tokens_and_no_reuse_figure():
    usage = {"input_tokens": 40, "output_tokens": 3}
    assert prompt_tokens_in_usage(usage) == 40 and reuse_from_usage(usage) is None


def test_null_cache_fields_count_as_none():
    usage = {"input_tokens": 40, "cache_creation_input_tokens": None, "cache_read_input_tokens": 10}
    assert prompt_tokens_in_usage(usage) == 50 and reuse_from_usage(usage) == (50, 10)


def test_openai_usage_is_read_as_before():
    assert prompt_tokens_in_usage({"prompt_tokens": 100, "completion_tokens": 2}) == 100
    assert reuse_from_usage({"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 96}}) == (100, 96)
