"""Drafted decode inside vllm-mlx's continuous-batching scheduler (in process), with our cache, on a tiny
model of every family and several sequences in flight: rows with drafts and rows without share each step,
drafts of every length are confirmed and cut short row by row, and the greedy tokens are those of the same
engine without drafts; a row ending on its token limit inside a confirmed run reports no token past it;
the next turn restores a drafted turn's cache and answers the same; sampled rows drafting the target's
likeliest tokens follow the target's distribution (a chi-square test against the exact one)."""

from __future__ import annotations

import pytest

from stable_prefix.engine_patch.drafts.drafting import Drafting
from tests.support.batched_scheduler import Arrival, batched_seams, scheduler, serve
from tests.support.family_chat import prompt
from tests.support.family_models import FAMILIES, shared_family_model
from tests.support.scripted_drafts import by_prompt, noisy_reference

STEP = 64
ANSWER = 24


def overlapping(tokenizer) -> list[Arrival]:
    """Main and subagent turns in flight together, a title request beside them, a later main turn."""
    title = prompt(tokenizer, "title", 1, system="Write a five-word title for the conversation.")
    return [
        Arrival(0, "main-1", prompt(tokenizer, "main", 1), max_tokens=ANSWER),
        Arrival(0, "sub-1", prompt(tokenizer, "subagent", 1), max_tokens=ANSWER),
        Arrival(3, "title", title, max_tokens=ANSWER // 2),
        Arrival(30, "main-3", prompt(tokenizer, "main", 3), max_tokens=ANSWER),
    ]


def drafts_for(tokenizer, arrivals: list[Arrival], reference, drafting_ids: set[str], kept: float) -> Drafting:
    """`on` drafting whose proposer drafts each listed request's reference answer, tokens changed at random."""
    continuations = {tuple(tokenizer.encode(arrival.prompt)): noisy_reference(reference.tokens[arrival.request_id], kept, seed=index)
                     for index, arrival in enumerate(arrivals) if arrival.request_id in drafting_ids}
    return Drafting("on", proposer=by_prompt(continuations))


def served(model, tokenizer, arrivals, drafting=None):
    with batched_seams(drafting=drafting) as seams:
        return serve(scheduler(model, tokenizer, prefill_step_size=STEP), arrivals, seams)


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_tokens_with_rows_drafting_beside_rows_not_equal_the_batched_engine_without_drafts(family):
    model, tokenizer = shared_family_model(family)
    arrivals = overlapping(tokenizer)
    reference = served(model, tokenizer, arrivals)
    drafting = drafts_for(tokenizer, arrivals, reference, {"main-1", "sub-1", "main-3"}, kept=0.7)  # the title drafts nothing
    ours = served(model, tokenizer, arrivals, drafting)
    stats = drafting.stats.figures()
    assert ours.tokens == reference.tokens
    assert 0 < stats["draft_accepted"] < stats["draft_proposed"], stats
    assert stats["decode_steps"] < stats["decode_tokens"], stats
    assert ours.cached_tokens["main-3"] > 0, "the next turn did not restore the drafted turn's cache"


def test_a_row_whose_token_limit_falls_inside_a_confirmed_run_reports_no_token_past_it():
    model, tokenizer = shared_family_model("qwen2")
    arrivals = [Arrival(0, "short", prompt(tokenizer, "main", 1), max_tokens=5), Arrival(0, "long", prompt(tokenizer, "subagent", 1), max_tokens=ANSWER)]
    reference = served(model, tokenizer, arrivals)
    drafting = drafts_for(tokenizer, arrivals, served(model, tokenizer, [Arrival(0, "short", arrivals[0].prompt, max_tokens=ANSWER), arrivals[1]]),
                          {"short", "long"}, kept=1.0)  # drafts run past the short request's limit
    ours = served(model, tokenizer, arrivals, drafting)
    assert ours.tokens == reference.tokens and len(ours.tokens["short"]) == 5


@pytest.mark.parametrize("family", ("qwen2", "qwen3_5"))
def test_a_row_with_a_repetition_penalty_decodes_beside_drafting_rows_without_drafts_and_is_counted(family):
    model, tokenizer = shared_family_model(family)  # on the hybrid, the penalised row rides along at the drafting rows' width
    arrivals = [Arrival(0, "main-1", prompt(tokenizer, "main", 1), max_tokens=ANSWER),
                Arrival(0, "penalised", prompt(tokenizer, "subagent", 1), max_tokens=ANSWER, repetition_penalty=1.3)]
    reference = served(model, tokenizer, arrivals)
    drafting = drafts_for(tokenizer, arrivals, reference, {"main-1", "penalised"}, kept=0.8)
    ours = served(model, tokenizer, arrivals, drafting)
    stats = drafting.stats.figures()
    assert ours.tokens == reference.tokens
    assert stats["draft_bypassed"] == {"logits processors": 1} and stats["draft_accepted"] > 0


SAMPLED_ROWS, SAMPLED_DEPTH, MIN_P = 600, 3, 0.8  # 12 continuations of three tokens for this prompt and model


@pytest.mark.slow
def test_sampled_rows_drafting_follow_the_target_s_distribution_at_every_drafted_position():
    import mlx.core as mx
    from mlx_lm.sample_utils import apply_min_p

    from tests.support.sampled_continuations import chi_square_p_value, continuation_probabilities, modes_after

    # Float32 weights (no exact ties at the min-p threshold); a hybrid, so rows feed the full width and
    # a row cut short puts its recurrent state back.
    model, tokenizer = shared_family_model("qwen3_5")
    text = "x = 1\n"
    prompt_ids = tokenizer.encode(text)
    probabilities, most_likely = continuation_probabilities(model, prompt_ids, lambda logprobs: apply_min_p(logprobs, MIN_P), SAMPLED_DEPTH,
                                                            tokenizer.eos_token_ids)
    drafting = Drafting("on", proposer=by_prompt({tuple(prompt_ids): modes_after(most_likely, SAMPLED_DEPTH)}))
    arrivals = [Arrival(0, f"sample-{index}", text, max_tokens=SAMPLED_DEPTH, temperature=1.0, min_p=MIN_P) for index in range(SAMPLED_ROWS)]
    mx.random.seed(0)
    ours = served(model, tokenizer, arrivals, drafting)
    stats = drafting.stats.figures()
    assert chi_square_p_value([tuple(ours.tokens[arrival.request_id]) for arrival in arrivals], probabilities) > 0.001
    # The second and third tokens were drafted (the first comes from the prompt's forward), confirmed and cut short.
    assert 0 < stats["draft_accepted"] < stats["draft_proposed"], stats
