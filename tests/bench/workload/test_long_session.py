"""The bytes bench's long session: one conversation of 100+ turns that grows until its prompt fills a 128K
context, with tool results of a working session's sizes (bench/workload/long_session.py)."""

import collections
import json

import numpy as np
import pytest

from stable_prefix.bench.run import as_received
from stable_prefix.bench.workload.long_session import DEFAULT_CONTEXT_TOKENS, MIN_TURNS, STEPS, generate_long_session, plan_turns
from stable_prefix.bench.workload.prompt_tokens import PromptRenderer
from stable_prefix.bench.workload.session import MAIN_LANE, TITLE_LANE
from tests.support.processes import REPO_ROOT

MODEL = REPO_ROOT / "build" / "tiny-model"


@pytest.fixture(scope="module")
def session():
    return generate_long_session(0, 1.0)


@pytest.fixture(scope="module")
def renderer():
    return PromptRenderer(MODEL, "tiny-model", "hermes")


def test_it_is_one_main_conversation_of_at_least_100_turns_and_its_title(session):
    lanes = collections.Counter((request.lane, request.conversation) for request in session)
    assert lanes[(MAIN_LANE, 0)] >= MIN_TURNS
    assert lanes == {(MAIN_LANE, 0): lanes[(MAIN_LANE, 0)], (TITLE_LANE, 0): 1}
    title = next(request for request in session if request.lane == TITLE_LANE)
    assert title.beside == 0


def test_it_is_the_same_bytes_for_the_same_seed_and_other_bytes_for_another():
    assert [r.body_bytes() for r in generate_long_session(0, 0.05)] == [r.body_bytes() for r in generate_long_session(0, 0.05)]
    assert generate_long_session(1, 0.05)[-1].body_bytes() != generate_long_session(0, 0.05)[-1].body_bytes()


def test_a_smaller_scale_keeps_every_turn_and_shrinks_their_sizes(session):
    small = generate_long_session(0, 0.05)
    assert len(small) == len(session)
    assert len(small[-1].body_bytes()) < len(session[-1].body_bytes()) / 5


def test_its_steps_are_dealt_in_the_shares_of_a_working_session():
    kinds = collections.Counter(kind for kind, _ in plan_turns(0, DEFAULT_CONTEXT_TOKENS))
    deck = sum(count for count, _ in STEPS.values())
    for kind, (count, _) in STEPS.items():
        assert kinds[kind] == pytest.approx(sum(kinds.values()) * count / deck, abs=count + 1), kind


def test_file_reads_are_2k_to_8k_tokens_at_full_size(session, renderer):
    reads = [block for request in session for message in request.body["messages"] if isinstance(message["content"], list)
             for block in message["content"] if block.get("type") == "tool_result" and str(block["content"]).lstrip().startswith("1\t")]
    sizes = {len(renderer.tokenizer.encode(str(read["content"]))) for read in {json.dumps(r): r for r in reads}.values()}
    assert sizes and min(sizes) >= 1_500 and max(sizes) <= 12_000


def test_each_turn_extends_the_one_before_and_the_last_fits_the_context(session, renderer):
    main = [request for request in session if request.lane == MAIN_LANE]
    previous = np.asarray(renderer.token_ids(as_received(main[-2].body, True)))
    last = np.asarray(renderer.token_ids(as_received(main[-1].body, True)))
    shared = int(np.argmax(previous != last[: len(previous)])) if (previous != last[: len(previous)]).any() else len(previous)
    assert shared >= len(previous) - 8  # all but the generation prompt
    assert 0.85 * DEFAULT_CONTEXT_TOKENS <= len(last) < DEFAULT_CONTEXT_TOKENS - 4_096  # grown to the context, a reply's room left
