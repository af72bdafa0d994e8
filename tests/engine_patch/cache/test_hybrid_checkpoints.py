"""A hybrid (recurrent/SSM layers) request snapshots its recurrent state only where a later request resumes (#37).

Each snapshot is a whole recurrent state (73.7 MiB at the Qwen3-Next shape), written to disk once, so a turn of
a conversation takes one, at its generation prompt: the next turn repeats everything before it.
"""

import numpy as np

from stable_prefix.engine_patch.cache.prompt_boundaries import checkpoint_positions

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


def test_a_branch_a_few_dozen_tokens_in_is_checkpointed_too():
    # A sliding-window cache cannot be cut back to a branch point: without its state a new conversation
    # sharing only the head would reuse nothing.
    prompt = messages(100, 50, 5)
    assert checkpoint_positions(prompt, START_IDS, after=0, diverges_at=18) == [18, 100, 150]


def test_a_message_start_just_before_the_chat_head_s_end_is_one_checkpoint():
    # vllm-mlx's head probe ends after the user message's role header, three tokens past its start.
    prompt = messages(100, 50, 80, 5)
    assert checkpoint_positions(prompt, START_IDS, after=0, head_length=103) == [103, 150, 230]
