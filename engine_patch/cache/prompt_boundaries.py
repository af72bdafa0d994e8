"""Where a rendered prompt's messages start, and so where to checkpoint it.

A model with positional layers (recurrent state, sliding windows) can only be
restored at positions where its state was snapshotted, so the generation
wrapper prefills up to a few chosen positions itself. They come from the
prompt's own token ids, not from any client's specifics: chat templates open
every message with a special token (ChatML `<|im_start|>`, Gemma
`<start_of_turn>`, harmony `<|start|>`, Llama 3 `<|start_header_id|>`, ...).

- the starts of the second and third messages: the end of the stable head
  (system, or system + developer/tools) that new conversations and subagent
  calls share;
- the start of the last message, the generation prompt: the next turn of this
  conversation repeats everything before it, whatever the template does with
  the reply and its thinking;
- the end of the chat head as vllm-mlx's own system-prefix probe finds it
  (system + tools rendered with two different user messages), for templates
  that put the system prompt inside the first user turn (Gemma);
- where the prompt stopped matching the best stored prefix, at the last
  message start before it (or right there, inside the first message, where
  the state is worth it: `min_branch_tokens`): the branch point the next
  sibling request shares.

A request keeps few: each is a whole recurrent state (73.7 MiB at the
Qwen3-Next shape) written to disk once, so a turn of a conversation takes one,
at its generation prompt, and only a lane's first request takes the head ones.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

MESSAGE_START_TOKENS = (
    "<|im_start|>",  # ChatML: Qwen, Nemotron, LFM2, SmolLM, ...
    "<start_of_turn>",  # Gemma
    "<|start|>",  # harmony: gpt-oss
    "<|start_header_id|>",  # Llama 3
    "<|header_start|>",  # Llama 4
    "<|start_of_role|>",  # Granite
    "<|im_user|>",  # Kimi
    "<|im_assistant|>",
    "<|im_system|>",
    "<｜User｜>",  # DeepSeek
    "<｜Assistant｜>",
)

# The most tokens a message's role header takes after its start token (Llama 3's
# `<|start_header_id|>user<|end_header_id|>\n\n` takes four).
HEADER_TOKENS = 8

# A branch point inside the first message earlier than this is checkpointed only
# where the positional state costs no more than the KV of the tokens it spares
# (`min_branch_tokens`).
MIN_BRANCH_TOKENS = 256


def min_branch_tokens(recurrent: bool) -> int:
    """The earliest branch point inside the first message worth a checkpoint, by what the state costs.

    A recurrent (gated-DeltaNet, Mamba) state is the same size wherever it is
    taken: 73.7 MiB at the Qwen3-Next shape, the KV of ~3,100 tokens of its 12
    attention layers (24 KiB a token), written to disk once, to spare the
    prefill of a few dozen tokens (a title request's or a subagent's system
    prompt sharing its first line with another's): not below one KV block's
    worth of tokens. A sliding-window state at position p (below the window)
    is p tokens of those layers' KV, less than the KV of the p tokens it
    spares; and that cache cannot be cut back to the branch point, so without
    its state a new conversation sharing only the head would reuse nothing
    (Gemma 3): kept wherever it is.
    """
    return MIN_BRANCH_TOKENS if recurrent else 0


# By tokenizer object, not id(): a tokenizer loaded after another was freed may
# get its address, and with it the wrong family's message starts.
_start_ids: weakref.WeakKeyDictionary[Any, np.ndarray] = weakref.WeakKeyDictionary()


def message_start_ids(tokenizer: Any) -> np.ndarray:
    """The ids of the message-start special tokens this tokenizer has."""
    if tokenizer not in _start_ids:
        vocabulary = tokenizer.get_vocab()
        _start_ids[tokenizer] = np.array([vocabulary[token] for token in MESSAGE_START_TOKENS if token in vocabulary], dtype=np.int64)
    return _start_ids[tokenizer]


def message_starts(tokens: list[int], start_ids: np.ndarray) -> list[int]:
    return [int(position) for position in np.flatnonzero(np.isin(np.asarray(tokens, dtype=np.int64), start_ids))]


def generation_prompt_start(tokens: list[int], start_ids: np.ndarray) -> int:
    """Where the last message (the generation prompt) starts; the prompt's length if no start is found."""
    starts = message_starts(tokens, start_ids)
    return starts[-1] if starts and starts[-1] > 0 else len(tokens)


def checkpoint_positions(
    tokens: list[int], start_ids: np.ndarray, *, after: int, head_length: int | None = None, diverges_at: int = 0,
    min_branch_tokens: int = 0,
) -> list[int]:
    """Positions strictly between `after` (already restored) and the prompt's last token; a branch point
    inside the first message only from `min_branch_tokens` on (see `min_branch_tokens()`)."""
    starts = message_starts(tokens, start_ids)
    wanted = set(starts[1:3])
    if starts:
        wanted.add(starts[-1])
    if head_length:
        wanted.add(head_length)
    if diverges_at > after:
        # A whole shared message is a stable branch point; inside the first
        # message (Gemma's system prompt opens the first user turn) only the
        # divergence itself is. Inside a later message it is not: that is the
        # previous reply rendered differently from how it was generated, which
        # no later request shares (the next turn resumes at this prompt's
        # generation prompt), so a snapshot there would be written for nothing.
        # A branch point a few dozen tokens in is kept where its state costs
        # less than what it spares (`min_branch_tokens()`).
        before = [position for position in starts[1:] if after < position <= diverges_at]
        if before:
            wanted.add(before[-1])
        elif diverges_at >= min_branch_tokens and not [position for position in starts[1:] if position <= diverges_at]:
            wanted.add(diverges_at)
    positions = sorted(position for position in wanted if after < position < len(tokens))
    return _apart(positions, keep={starts[-1] if starts else None, head_length})


def _apart(positions: list[int], keep: set[int | None]) -> list[int]:
    """`positions` without those a few tokens before the next one: a message start and the end of its role
    header (`<|im_start|>user\n`, where vllm-mlx's head probe ends) serve the same requests, as every one that
    shares the start shares the header too. The generation prompt's start (where the next turn resumes) and
    the chat head (pinned) are always kept."""
    kept = []
    for index, position in enumerate(positions):
        following = positions[index + 1] if index + 1 < len(positions) else None
        if position in keep or following is None or following - position > HEADER_TOKENS:
            kept.append(position)
    return kept
