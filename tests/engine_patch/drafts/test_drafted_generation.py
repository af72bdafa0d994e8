"""SimpleEngine's drafted decode (mlx_lm.stream_generate with the prefix cache and drafts, in process), on a
tiny model of every family: greedy answers are token for token those of decoding without drafts while drafts
are confirmed and cut short at every depth, warm turns restored from a drafted turn's cache answer the same,
a consumer stopping inside a drafted run leaves the cache holding what it was given, requests drafts must not
touch decode as mlx-lm does (counted), and a compute-bound verify-cost curve drafts and shadows nothing."""

from __future__ import annotations

import pytest
from mlx_lm.sample_utils import apply_top_k, make_logits_processors, make_sampler

from stable_prefix.engine_patch.cache.request_plan import prompt_token_ids
from stable_prefix.engine_patch.drafts.cost_gate import VerifyCostCurve
from stable_prefix.engine_patch.drafts.drafting import Drafting
from tests.support.drafted_stream_generate import drafted_stream_generate
from tests.support.family_chat import ORIGINAL_STREAM_GENERATE
from tests.support.family_models import FAMILIES, shared_family_model
from tests.support.scripted_drafts import noisy_reference, scripted

# Past the tiny models' 64-token sliding windows, so drafts are verified and cut back in wrapped windows.
PROMPT = "def add(a, b):\n    return a + b\n\n" * 4
ANSWER_TOKENS = 40

def answer(generate, model, tokenizer, max_tokens: int = ANSWER_TOKENS, **kwargs) -> list[int]:
    kwargs.setdefault("sampler", make_sampler(temp=0.0))
    return [response.token for response in generate(model, tokenizer, prompt_token_ids(tokenizer, PROMPT), max_tokens, **kwargs)]


def without_drafts(model, tokenizer, **kwargs) -> list[int]:
    return answer(ORIGINAL_STREAM_GENERATE, model, tokenizer, **kwargs)


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_answers_with_drafts_cut_short_at_every_depth_equal_those_without(family):
    model, tokenizer = shared_family_model(family)
    reference = without_drafts(model, tokenizer)
    drafting = Drafting("on", proposer=scripted(noisy_reference(reference, kept=0.75)))
    with drafted_stream_generate(drafting) as generate:
        cold, warm = answer(generate, model, tokenizer), answer(generate, model, tokenizer)
    stats = drafting.stats.figures()
    assert cold == reference and warm == reference  # the warm turn is restored from the drafted turn's cache
    assert 0 < stats["draft_accepted"] < stats["draft_proposed"], stats  # drafts confirmed, and cut short
    assert stats["decode_steps"] < stats["decode_tokens"] == 2 * len(reference)


def test_drafts_from_the_answer_s_own_repetition_cut_the_forward_passes_and_keep_the_answer():
    model, tokenizer = shared_family_model("qwen2")  # its greedy answer to this prompt repeats itself
    prompt = prompt_token_ids(tokenizer, "hello " * 20)
    reference = [r.token for r in ORIGINAL_STREAM_GENERATE(model, tokenizer, prompt, 60, sampler=make_sampler(temp=0.0))]
    drafting = Drafting("on")  # the real suffix proposer
    with drafted_stream_generate(drafting) as generate:
        drafted = [r.token for r in generate(model, tokenizer, prompt, 60, sampler=make_sampler(temp=0.0))]
    stats = drafting.stats.figures()
    assert drafted == reference
    assert stats["draft_accepted"] > 0 and stats["decode_steps_per_token"] < 0.9, stats


def test_a_consumer_stopping_inside_a_drafted_run_leaves_the_cache_holding_what_it_was_given():
    model, tokenizer = shared_family_model("qwen3_5")  # recurrent layers: the hardest to roll back
    reference = without_drafts(model, tokenizer)
    drafting = Drafting("on", proposer=scripted(noisy_reference(reference, kept=1.0)))
    with drafted_stream_generate(drafting) as generate:
        stream = generate(model, tokenizer, prompt_token_ids(tokenizer, PROMPT), ANSWER_TOKENS, sampler=make_sampler(temp=0.0))
        given = [next(stream).token for _ in range(7)]  # a stop sequence ends the answer here
        stream.close()
        entries = generate.generate.cache.stats()["entry_tokens"]
        warm = answer(generate, model, tokenizer)
    assert given == reference[:7]
    assert entries == [len(prompt_token_ids(tokenizer, PROMPT)) + 7]
    assert warm == reference


def test_a_request_with_logits_processors_decodes_as_mlx_lm_does_and_is_counted():
    model, tokenizer = shared_family_model("qwen2")
    processors = make_logits_processors(repetition_penalty=1.3)
    reference = without_drafts(model, tokenizer, logits_processors=processors)
    drafting = Drafting("on", proposer=scripted(noisy_reference(reference)))
    with drafted_stream_generate(drafting) as generate:
        drafted = answer(generate, model, tokenizer, logits_processors=processors)
    stats = drafting.stats.figures()
    assert drafted == reference
    assert stats["draft_bypassed"] == {"logits processors": 1} and stats["draft_proposed"] == 0
    assert stats["decode_steps"] == stats["decode_tokens"] == len(reference)


def test_auto_on_a_compute_bound_curve_proposes_nothing_and_counts_one_step_per_token():
    model, tokenizer = shared_family_model("qwen2")
    reference = without_drafts(model, tokenizer)
    proposals = []
    drafting = Drafting("auto", proposer=scripted(lambda generated, count: proposals.append(count) or reference[len(generated):][:count]))
    drafting._prepared.set(model, True)  # this CPU's curve, as measured for SmolLM2-135M: k tokens cost about k steps
    drafting.curve = VerifyCostCurve({1: 1.0, 2: 1.95, 3: 2.9, 4: 3.85}, "compute-bound, as measured here")
    with drafted_stream_generate(drafting) as generate:
        drafted = answer(generate, model, tokenizer)
    stats = drafting.stats.figures()
    assert drafted == reference and proposals == []
    assert stats["decode_steps"] == stats["decode_tokens"] == len(reference) and stats["draft_proposed"] == 0
    assert drafting.decision()["drafting"] == "off"



SAMPLES = 500
DEPTH, TOP_K = 4, 2  # continuations of four tokens, each drawn from the renormalised top two


@pytest.mark.slow
def test_sampled_answers_with_drafts_follow_the_target_s_distribution_at_every_drafted_position():
    import mlx.core as mx

    from stable_prefix.engine_patch.vllm_mlx import detokenizer_map
    from tests.support.sampled_continuations import chi_square_p_value, continuation_probabilities, modes_after

    detokenizer_map.install()  # as the server runs: no 151K-entry token map rebuilt per request
    # Float32 weights: the top two are never an exact tie (in float16 they can be, and either may be drawn).
    # A hybrid: a draft cut short puts its recurrent state back, the path with the most to get wrong.
    model, tokenizer = shared_family_model("qwen3_5")
    prompt = prompt_token_ids(tokenizer, "hello hello")
    # stream_generate ends an answer at an end token (it hands that token out last).
    probabilities, most_likely = continuation_probabilities(model, prompt, lambda logprobs: apply_top_k(logprobs, TOP_K), DEPTH,
                                                            tokenizer.eos_token_ids)

    drafting = Drafting("on", proposer=scripted(modes_after(most_likely, DEPTH)))
    mx.random.seed(0)
    sampler = make_sampler(temp=1.0, top_k=TOP_K)
    with drafted_stream_generate(drafting) as generate:
        drafted = [tuple(r.token for r in generate(model, tokenizer, prompt, DEPTH, sampler=sampler)) for _ in range(SAMPLES)]
    stats = drafting.stats.figures()
    assert chi_square_p_value(drafted, probabilities) > 0.001
    # The third and fourth tokens were drafted (two tokens after the first two), drafts confirmed and cut short.
    assert 0 < stats["draft_accepted"] < stats["draft_proposed"], stats
