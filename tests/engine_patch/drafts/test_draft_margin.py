"""The margin rule (drafts/verification.py): a greedy token is taken from a forward of more than one token only
where its lead over the second best exceeds the verify's measured error bound; a near tie ends the run and a
one-token forward decides it. Near ties constructed in the rule's inputs; then both engines on many prompts
over every family's tiny model, greedy answers with drafts equal to those without, token for token, including
with a bound every position falls under (every drafted decision made again by a one-token forward), and a
model cast to bfloat16, whose flat random logits tie often, where drafts without the rule answer otherwise."""

from __future__ import annotations

import functools

import mlx.core as mx
import pytest
from mlx_lm.sample_utils import make_sampler

from stable_prefix.engine_patch.cache.request_plan import prompt_token_ids
from stable_prefix.engine_patch.drafts import verification
from stable_prefix.engine_patch.drafts.drafting import Drafting
from stable_prefix.engine_patch.drafts.verification import argmax_sampler, decided_run, decisive, greedy, margin_bound
from tests.support.batched_scheduler import Arrival, batched_seams, scheduler, serve
from tests.support.drafted_stream_generate import drafted_stream_generate
from tests.support.family_chat import ORIGINAL_STREAM_GENERATE
from tests.support.family_models import FAMILIES, fresh_family_model, shared_family_model
from tests.support.scripted_drafts import by_prompt, noisy_reference, scripted

PROMPTS = 8
ANSWER_TOKENS = 32
# make test runs the engines' tests on every family; the fast loop (make test-fast, 5 minutes for the whole loop) on
# plain attention (qwen2) and a hybrid whose cut drafts put recurrent state back (qwen3_5), since each further family
# costs the same forwards again (every family took this file 4.7 min of the loop's 6).
FAST_FAMILIES = ("qwen2", "qwen3_5")
EVERY_FAMILY = [family if family in FAST_FAMILIES else pytest.param(family, marks=pytest.mark.slow) for family in FAMILIES]
# Deciding every drafted position again doubles the forwards: the fast loop does it on the hybrid alone.
HYBRID_FAST = [family if family == "qwen3_5" else pytest.param(family, marks=pytest.mark.slow) for family in FAMILIES]


def texts(count: int = PROMPTS) -> list[str]:
    return [f"item {index}: " + " ".join(f"w{(index * 7 + word) % 13}" for word in range(40)) for index in range(count)]


def logprobs_with_lead(lead: float, dtype=mx.float32) -> mx.array:
    """One position's log-probabilities: token 3 ahead of token 8 by `lead`, the rest far behind."""
    values = mx.full((16,), -20.0)
    values = mx.where(mx.arange(16) == 3, -0.5, values)
    return mx.where(mx.arange(16) == 8, -0.5 - lead, values).astype(dtype)


# --- the rule's inputs -------------------------------------------------------------------


def test_a_lead_within_the_bound_is_not_decisive_and_one_beyond_it_is():
    for dtype in (mx.float32, mx.float16, mx.bfloat16):
        bound = margin_bound(dtype)
        assert not decisive(logprobs_with_lead(bound / 4, dtype)).item()
        assert decisive(logprobs_with_lead(bound * 4, dtype)).item()
    assert not decisive(logprobs_with_lead(0.0)).item()  # an exact tie


def test_the_bound_is_wider_where_the_dtype_is_coarser():
    assert margin_bound(mx.float32) < margin_bound(mx.float16) < margin_bound(mx.bfloat16)


def test_a_near_tie_inside_a_confirmed_draft_ends_the_run_before_it_and_leaves_that_token_undecided():
    assert decided_run([5, 6, 7], [5, 6, 7, 1], sure=[True, False, True, True]) == (1, False)


def test_a_near_tie_on_the_token_after_the_confirmed_draft_keeps_the_draft_and_leaves_that_token_undecided():
    assert decided_run([5, 6, 7], [5, 6, 7, 1], sure=[True, True, True, False]) == (3, False)
    assert decided_run([5, 6, 7], [5, 9, 7, 1], sure=[True, False, True, True]) == (1, False)


def test_a_near_tie_after_the_first_disagreement_changes_nothing():
    assert decided_run([5, 6, 7], [5, 9, 7, 1], sure=[True, True, False, False]) == (1, True)


def test_a_sampled_row_keeps_the_plain_rule():
    assert decided_run([5, 6, 7], [5, 6, 7, 1], sure=None) == (3, True)
    assert decided_run([5, 6, 7], [5, 6, 9, 1], sure=None) == (2, True)


def test_greedy_samplers_are_recognised_and_sampling_ones_are_not():
    assert greedy(make_sampler(temp=0.0)) and greedy(argmax_sampler)
    assert not greedy(make_sampler(temp=0.7)) and not greedy(make_sampler(temp=0.5, min_p=0.1)) and not greedy(None)


# --- SimpleEngine's drafted decode ---------------------------------------------------------------


def simple_reference_answers(model, tokenizer) -> list[list[int]]:
    """Greedy answers to every prompt, without drafts."""
    return [[r.token for r in ORIGINAL_STREAM_GENERATE(model, tokenizer, prompt_token_ids(tokenizer, text), ANSWER_TOKENS,
                                                       sampler=make_sampler(temp=0.0))] for text in texts()]


@functools.cache
def simple_reference(family: str) -> list[list[int]]:
    """The shared model's answers without drafts, decoded once for every test of its family (greedy: always the same)."""
    return simple_reference_answers(*shared_family_model(family))


def simple_answers(model, tokenizer, references: list[list[int]], kept: float = 0.8) -> tuple[list[list[int]], dict]:
    """Greedy answers to every prompt with drafts of its reference answer (tokens changed at random)."""
    answers, totals = [], {"draft_near_ties": 0, "decode_steps": 0, "decode_tokens": 0, "draft_accepted": 0}
    for index, (text, reference) in enumerate(zip(texts(), references)):
        drafting = Drafting("on", proposer=scripted(noisy_reference(reference, kept=kept, seed=index)))
        with drafted_stream_generate(drafting) as generate:
            answers.append([r.token for r in generate(model, tokenizer, prompt_token_ids(tokenizer, text), ANSWER_TOKENS,
                                                      sampler=make_sampler(temp=0.0))])
        figures = drafting.stats.figures()
        for name in totals:
            totals[name] += figures[name]
    return answers, totals


@pytest.mark.parametrize("family", EVERY_FAMILY)
def test_simple_engine_greedy_answers_with_drafts_equal_those_without_on_every_prompt(family):
    reference = simple_reference(family)
    drafted, totals = simple_answers(*shared_family_model(family), reference)
    assert drafted == reference
    assert totals["draft_accepted"] > 0, totals


@pytest.mark.parametrize("family", HYBRID_FAST)
def test_simple_engine_deciding_every_drafted_position_again_alone_answers_the_same(family, monkeypatch):
    reference = simple_reference(family)
    monkeypatch.setattr(verification, "MARGIN_FACTOR", float("inf"))  # every position a near tie
    drafted, totals = simple_answers(*shared_family_model(family), reference)
    assert drafted == reference
    assert totals["draft_near_ties"] > 0 and totals["decode_steps"] > totals["decode_tokens"], totals


@pytest.mark.slow  # needs many answers to meet its ties: three passes over every prompt
def test_simple_engine_on_a_model_whose_logits_tie_often_drafts_without_the_rule_answer_otherwise_and_with_it_the_same(monkeypatch):
    model, tokenizer = fresh_family_model("nemotron_h", mx.bfloat16)  # a chunked Mamba2 scan against one-token updates, in bfloat16
    reference = simple_reference_answers(model, tokenizer)
    with monkeypatch.context() as without_rule:
        without_rule.setattr(verification, "MARGIN_FACTOR", -1.0)
        unguarded, _ = simple_answers(model, tokenizer, reference)
    guarded, totals = simple_answers(model, tokenizer, reference)
    assert unguarded != reference  # the failure the rule is for
    assert sum(a == b for a, b in zip(guarded, reference)) > sum(a == b for a, b in zip(unguarded, reference))
    assert totals["draft_near_ties"] > 0, totals


# --- the batched engine ----------------------------------------------------------------------------


def arrivals() -> list[Arrival]:
    """Every prompt in flight together (two waves)."""
    return [Arrival(0 if index < PROMPTS // 2 else 5, f"r{index}", text, max_tokens=ANSWER_TOKENS) for index, text in enumerate(texts())]


@functools.cache
def batched_reference(family: str) -> dict[str, list[int]]:
    """The batched engine's greedy answers without drafts on the shared model, served once for every test of its family."""
    model, tokenizer = shared_family_model(family)
    with batched_seams() as seams:
        return serve(scheduler(model, tokenizer, prefill_step_size=64), arrivals(), seams).tokens


def batched_answers(family: str, kept: float = 0.8) -> tuple[dict[str, list[int]], dict]:
    """The batched engine's greedy answers with drafts, each request drafting its reference answer (tokens changed at random)."""
    model, tokenizer = shared_family_model(family)
    reference = batched_reference(family)
    continuations = {tuple(tokenizer.encode(arrival.prompt)): noisy_reference(reference[arrival.request_id], kept, seed=index)
                     for index, arrival in enumerate(arrivals())}
    drafting = Drafting("on", proposer=by_prompt(continuations))
    with batched_seams(drafting=drafting) as seams:
        ours = serve(scheduler(model, tokenizer, prefill_step_size=64), arrivals(), seams)
    return ours.tokens, drafting.stats.figures()


@pytest.mark.parametrize("family", EVERY_FAMILY)
def test_batched_engine_greedy_answers_with_drafts_equal_those_without_on_every_prompt(family):
    drafted, figures = batched_answers(family)
    assert drafted == batched_reference(family)
    assert figures["draft_accepted"] > 0, figures


@pytest.mark.parametrize("family", HYBRID_FAST)
def test_batched_engine_deciding_every_drafted_position_again_alone_answers_the_same(family, monkeypatch):
    monkeypatch.setattr(verification, "MARGIN_FACTOR", float("inf"))
    drafted, figures = batched_answers(family)
    assert drafted == batched_reference(family)
    assert figures["draft_near_ties"] + figures["draft_near_ties_taken_wide"] > 0, figures
