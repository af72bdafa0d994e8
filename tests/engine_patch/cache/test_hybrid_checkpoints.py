"""A hybrid (recurrent/SSM layers) request snapshots its recurrent state only where a later request resumes (#37).

Each snapshot is a whole recurrent state (73.7 MiB at the Qwen3-Next shape), written to disk once, so a turn of
a conversation takes one, at its generation prompt: the next turn repeats everything before it.
"""

import numpy as np
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache

from stable_prefix.engine_patch.cache.cache_layers import has_recurrent_state
from stable_prefix.engine_patch.cache.prompt_boundaries import checkpoint_positions, min_branch_tokens

START = 1  # the message-start token (ChatML's <|im_start|>) in these made-up prompts
START_IDS = np.array([START])


def messages(*lengths: int) -> list[int]:
    """A prompt of messages of these lengths, each opening with START."""
    tokens = []
    for length in lengths:
        tokens += [START] + [7] * (length - 1)
    return tokens


def test_a_turn_resumed_at_the_previous_generation_prompt_checkpoints_only_its_own():
    # system 100, user 50, the previous reply (at 150) re-rendered differently from token 170 on, a tool
    # result, and the new generation prompt at 300.
    prompt = messages(100, 50, 80, 70, 5)
    assert checkpoint_positions(prompt, START_IDS, after=150, diverges_at=170) == [300]


def test_a_turn_of_many_messages_still_checkpoints_at_a_branch_point_inside_them():
    # The best stored lane shares the tool result at 230 too: a sibling request branches there.
    prompt = messages(100, 50, 80, 70, 5)
    assert checkpoint_positions(prompt, START_IDS, after=150, diverges_at=260) == [230, 300]


def test_a_branch_inside_the_first_message_is_checkpointed_where_it_diverges():
    # Gemma puts the system prompt inside the first user turn: the shared part ends mid-message.
    prompt = messages(400, 50, 5)
    assert checkpoint_positions(prompt, START_IDS, after=0, diverges_at=300) == [300, 400, 450]


# The layer kinds of a hybrid's cache (gated-DeltaNet state beside attention) and of Gemma 3's (sliding windows
# beside global attention), as mlx-lm makes them.
RECURRENT = [ArraysCache(size=2), KVCache()]
SLIDING_WINDOW = [RotatingKVCache(max_size=512), KVCache()]


def first_message_branch(layers: list, diverges_at: int) -> list[int]:
    """Checkpoints of a prompt whose 300-token first message diverges from the best stored lane at `diverges_at`."""
    prompt = messages(300, 50, 5)
    return checkpoint_positions(prompt, START_IDS, after=0, diverges_at=diverges_at,
                                min_branch_tokens=min_branch_tokens(has_recurrent_state(layers)))


def test_a_recurrent_state_is_not_written_for_a_branch_a_few_dozen_tokens_in():
    # A title request sharing the system prompt's first line: 73.7 MiB of state would spare 40 tokens of prefill.
    assert first_message_branch(RECURRENT, diverges_at=40) == [300, 350]


def test_a_sliding_window_keeps_its_checkpoint_at_a_branch_a_few_dozen_tokens_in():
    # A sliding-window cache cannot be cut back to a branch point: without its state a new conversation
    # sharing only the head would reuse nothing (Gemma 3); the state is 40 tokens of those layers' KV.
    assert first_message_branch(SLIDING_WINDOW, diverges_at=40) == [40, 300, 350]


def test_a_branch_past_min_branch_tokens_is_checkpointed_for_either_kind():
    assert first_message_branch(RECURRENT, diverges_at=280) == [280, 300, 350]
    assert first_message_branch(SLIDING_WINDOW, diverges_at=280) == [280, 300, 350]


def test_a_message_start_just_before_the_chat_head_s_end_is_one_checkpoint():
    # vllm-mlx's head probe ends after the user message's role header, three tokens past its start.
    prompt = messages(100, 50, 80, 5)
    assert checkpoint_positions(prompt, START_IDS, after=0, head_length=103) == [103, 150, 230]
