"""Our cache inside vllm-mlx's continuous-batching scheduler, in process, with a tiny model of
every family and several sequences in flight at once: greedy tokens equal those of the same
batched engine without our cache, every follow-up turn restores its lane's previous prompt, a
fan-out group prefills its shared head once, and every fault falls back to an uncached answer."""

from __future__ import annotations

import logging

import pytest

from stable_prefix.engine_patch.cache.kv_blocks import BLOCK_TOKENS
from stable_prefix.engine_patch.cache.shared_prefill import MIN_SHARED_TOKENS
from tests.support.batched_scheduler import Arrival, batched_seams, scheduler, serve, served_without_our_cache
from tests.support.family_chat import chat_head, prompt, resume_position
from tests.support.family_models import FAMILIES, shared_family_model

# Small prefill chunks, so a prompt takes several steps and requests overlap in the batch.
STEP = 64
HYBRIDS = ("qwen3_5", "nemotron_h")


def reference(model, tokenizer, arrivals: list[Arrival]):
    return served_without_our_cache(model, tokenizer, arrivals, prefill_step_size=STEP)


def lanes(tokenizer) -> list[Arrival]:
    """Claude Code's lanes, overlapping: main and subagent turns in flight together, a title
    request beside them, later turns of both, a new conversation with the same system and tools."""
    head = chat_head(tokenizer)
    title = prompt(tokenizer, "title", 1, system="Write a five-word title for the conversation.")
    return [
        Arrival(0, "main-1", prompt(tokenizer, "main", 1), head=head),
        Arrival(0, "sub-1", prompt(tokenizer, "subagent", 1), head=head),
        Arrival(1, "title", title),
        Arrival(40, "main-3", prompt(tokenizer, "main", 3), head=head),
        Arrival(40, "sub-3", prompt(tokenizer, "subagent", 3), head=head),
        Arrival(42, "new-1", prompt(tokenizer, "new", 1), head=head),
        Arrival(80, "main-5", prompt(tokenizer, "main", 5), head=head),
    ]


@pytest.mark.parametrize("block_tokens", [BLOCK_TOKENS, 16], ids=["blocks-as-served", "16-token-blocks"])
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_tokens_with_our_cache_equal_the_batched_engine_without_it_on_overlapping_lanes(family, block_tokens):
    """With small blocks too: a restore then concatenates many blocks, some used in part."""
    model, tokenizer = shared_family_model(family)
    arrivals = lanes(tokenizer)
    expected = reference(model, tokenizer, arrivals)
    with batched_seams(block_tokens=block_tokens) as seams:
        ours = serve(scheduler(model, tokenizer, prefill_step_size=STEP), arrivals, seams)
        stats = seams.planner.cache.stats()
    assert ours.tokens == expected.tokens
    by_id = {arrival.request_id: arrival for arrival in arrivals}
    for follow_up, previous in (("main-3", "main-1"), ("sub-3", "subagent-1"), ("main-5", "main-3")):
        previous = previous.replace("subagent", "sub")
        assert ours.cached_tokens[follow_up] >= resume_position(tokenizer, by_id[previous].prompt), f"{follow_up} lost its warm prefix"
    assert ours.cached_tokens["new-1"] > 0, "the new conversation did not reuse the shared head"
    assert ours.reported == ours.cached_tokens, "usage must report what was restored"
    assert stats["fallbacks"] == 0 and not seams.planner.unsupported_reasons()


def fan_out(tokenizer, step: int = 0) -> list[Arrival]:
    """Three Explore-like instances started at once: one long system prompt, each its own task."""
    system = "You explore repositories and report what you find, file by file. " * 30
    return [Arrival(step, f"explore-{index}", prompt(tokenizer, f"explore {index}: the {topic} code", 1, system=system))
            for index, topic in enumerate(("parser", "storage", "network"))]


@pytest.mark.parametrize("family", ("qwen2", "qwen3_5"))
def test_a_fan_out_group_arriving_together_prefills_its_shared_head_once(family):
    model, tokenizer = shared_family_model(family)
    arrivals = fan_out(tokenizer)
    expected = reference(model, tokenizer, arrivals)
    with batched_seams() as seams:
        ours = serve(scheduler(model, tokenizer, prefill_step_size=STEP), arrivals, seams)
        prefilled = seams.planner.cache.stats()["tokens_prefilled"]
    assert ours.tokens == expected.tokens
    prompts = [tokenizer.encode(arrival.prompt) for arrival in arrivals]
    shared = next(i for i, tokens in enumerate(zip(*prompts)) if len(set(tokens)) > 1)
    assert sorted(ours.cached_tokens.values())[1:] >= [shared - 8] * 2, ours.cached_tokens
    assert prefilled <= sum(map(len, prompts)) - 2 * (shared - 8)


@pytest.mark.parametrize("family", ("qwen2", "qwen3_5"))
def test_a_request_arriving_while_another_prefills_their_shared_prefix_waits_for_it(family):
    model, tokenizer = shared_family_model(family)
    first, second, _ = fan_out(tokenizer)
    arrivals = [first, Arrival(2, second.request_id, second.prompt)]  # the first is two chunks in
    expected = reference(model, tokenizer, arrivals)
    with batched_seams() as seams:
        ours = serve(scheduler(model, tokenizer, prefill_step_size=STEP), arrivals, seams)
    assert ours.tokens == expected.tokens
    assert ours.cached_tokens[second.request_id] >= MIN_SHARED_TOKENS


def test_a_request_arriving_after_another_prefilled_past_their_shared_prefix_takes_it_from_that_state():
    model, tokenizer = shared_family_model("qwen2")  # plain attention: a state can be rewound to the shared part
    first, second, _ = fan_out(tokenizer)
    arrivals = [Arrival(0, first.request_id, first.prompt, max_tokens=40), Arrival(30, second.request_id, second.prompt)]
    expected = reference(model, tokenizer, arrivals)
    with batched_seams() as seams:
        ours = serve(scheduler(model, tokenizer, prefill_step_size=STEP), arrivals, seams)
    assert ours.tokens == expected.tokens
    assert ours.cached_tokens[second.request_id] >= MIN_SHARED_TOKENS


@pytest.fixture
def prefill_steps(monkeypatch) -> list[list[int]]:
    """The lengths of the prompts each prefill step of mlx-lm's generator ran together."""
    from mlx_lm.generate import PromptProcessingBatch

    steps: list[list[int]] = []
    prompt = PromptProcessingBatch.prompt

    def recorded(batch, tokens):
        if tokens:
            steps.append([len(chunk) for chunk in tokens])
        return prompt(batch, tokens)

    monkeypatch.setattr(PromptProcessingBatch, "prompt", recorded)
    return steps


@pytest.mark.parametrize("family", FAMILIES)
def test_prompts_of_different_lengths_in_flight_prefill_together_and_answer_as_alone(family, prefill_steps):
    model, tokenizer = shared_family_model(family)
    arrivals = [Arrival(0, "title", prompt(tokenizer, "title", 1, system="Write a five-word title.")),
                Arrival(0, "main", prompt(tokenizer, "main", 3)), Arrival(0, "sub", prompt(tokenizer, "subagent", 5))]
    alone = {arrival.request_id: serve(scheduler(model, tokenizer), [arrival]).tokens[arrival.request_id] for arrival in arrivals}
    prefill_steps.clear()
    with batched_seams() as seams:
        ours = serve(scheduler(model, tokenizer, prefill_step_size=STEP), arrivals, seams).tokens
    assert ours == alone
    assert max(map(len, prefill_steps)) == len(arrivals), "the prompts were not prefilled together"
    if family in HYBRIDS:  # no padding for recurrent layers (recurrent_padding_fix)
        assert all(len(set(lengths)) == 1 for lengths in prefill_steps), prefill_steps


def two_turns(tokenizer) -> list[Arrival]:
    return [Arrival(0, "turn-1", prompt(tokenizer, "main", 1)), Arrival(40, "turn-3", prompt(tokenizer, "main", 3)),
            Arrival(40, "side", prompt(tokenizer, "subagent", 1))]


def test_a_failing_restore_runs_the_request_uncached_and_counts_a_fallback(monkeypatch, caplog):
    model, tokenizer = shared_family_model("qwen2")
    arrivals = two_turns(tokenizer)
    expected = reference(model, tokenizer, arrivals)

    def broken_restore(*args):
        raise RuntimeError("injected restore failure")

    with batched_seams() as seams, caplog.at_level(logging.WARNING, logger="engine_patch"):
        monkeypatch.setattr("stable_prefix.engine_patch.cache.ram_tier.restore_from_blocks", broken_restore)
        seams.planner.cache.live.limit = 0  # else turn-3 takes over turn-1's live cache: no restore to fail
        ours = serve(scheduler(model, tokenizer, prefill_step_size=STEP), arrivals, seams)
        stats = seams.planner.cache.stats()
    assert ours.tokens == expected.tokens
    assert ours.reported["turn-3"] == 0
    assert stats["fallbacks"] >= 1 and "injected restore failure" in stats["last_fallback_reason"]
    assert "injected restore failure" in caplog.text


def test_a_failing_snapshot_keeps_the_answers_and_stores_nothing(monkeypatch):
    model, tokenizer = shared_family_model("qwen2")
    arrivals = two_turns(tokenizer)
    expected = reference(model, tokenizer, arrivals)

    def broken_snapshot(*args):
        raise RuntimeError("injected snapshot failure")

    with batched_seams() as seams:
        monkeypatch.setattr("stable_prefix.engine_patch.cache.ram_tier.copy_block", broken_snapshot)
        ours = serve(scheduler(model, tokenizer, prefill_step_size=STEP), arrivals, seams)
        stats = seams.planner.cache.stats()
    assert ours.tokens == expected.tokens
    assert stats["entries"] == 0 and stats["fallbacks"] == 3


def test_a_failing_checkpoint_is_counted_and_the_request_goes_on(monkeypatch):
    model, tokenizer = shared_family_model("qwen3_5")
    arrivals = two_turns(tokenizer)
    expected = reference(model, tokenizer, arrivals)

    def broken_snapshot(prompt_cache, indices=None):
        raise RuntimeError("injected checkpoint failure")

    with batched_seams() as seams:
        monkeypatch.setattr("stable_prefix.engine_patch.cache.request_plan.snapshot", broken_snapshot)
        ours = serve(scheduler(model, tokenizer, prefill_step_size=STEP), arrivals, seams)
        stats = seams.planner.cache.stats()
    assert ours.tokens == expected.tokens
    assert stats["fallbacks"] >= 1 and "injected checkpoint failure" in stats["last_fallback_reason"]


def test_an_aborted_prefill_stores_nothing_and_the_request_waiting_for_it_goes_on():
    model, tokenizer = shared_family_model("qwen2")
    first, second, _ = fan_out(tokenizer)
    arrivals = [first, Arrival(1, second.request_id, second.prompt)]
    expected = reference(model, tokenizer, [Arrival(1, second.request_id, second.prompt)])
    with batched_seams() as seams:
        batched = scheduler(model, tokenizer, prefill_step_size=STEP)
        step = batched.step

        def step_then_abort_the_first():
            output = step()
            if second.request_id in batched.requests and first.request_id in batched.requests:
                batched.abort_request(first.request_id)
            return output

        batched.step = step_then_abort_the_first
        ours = serve(batched, arrivals, seams)
        stats = seams.planner.cache.stats()
    assert ours.tokens[second.request_id] == expected.tokens[second.request_id]
    assert stats["entry_tokens"] == [len(tokenizer.encode(second.prompt)) + len(ours.tokens[second.request_id])]


@pytest.mark.parametrize("setting", [{"kv_cache_quantization": True}, {"max_kv_size": 512}, {"use_paged_cache": True}])
def test_a_configuration_whose_caches_ours_does_not_build_keeps_vllm_mlxs_own_prefix_cache(setting):
    model, tokenizer = shared_family_model("qwen2")
    with batched_seams() as seams:
        kept = scheduler(model, tokenizer, enable_prefix_cache=True, **setting)
        assert kept not in seams.served
        assert kept.memory_aware_cache is not None or kept.block_aware_cache is not None
        ours = scheduler(model, tokenizer, enable_prefix_cache=True)
        assert ours in seams.served
        assert ours.memory_aware_cache is None and ours.block_aware_cache is None and ours.prefix_cache is None
