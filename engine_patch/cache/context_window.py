"""Whether a prompt fits the model's context, decided before any of it is prefilled.

A prompt longer than the model's context (a 10 MB paste: 2.1M tokens against
131,072) cannot give a useful answer, yet vllm-mlx as shipped prefills it for
minutes while every other request waits. This module decides it from the
token count alone, so any engine seam that knows a prompt's tokens (the
SimpleEngine's `stream_generate`, a batching scheduler's admission) refuses it
the same way, before its first chunk; the HTTP layer (`admission.py`) turns the
refusal into each protocol's own error.
"""

from __future__ import annotations

from typing import Any

# Hugging Face tokenizers report int(1e30) and the like when no length is set.
UNSET_TOKENIZER_LENGTH = 10**7
CONTEXT_FIELDS = ("max_position_embeddings", "max_sequence_length", "seq_length")
# A prompt text longer than this many characters per token of context is checked piece by piece first
# (`estimated_tokens_if_far_too_long`): real conversations run 3-5 characters per token.
FAR_TOO_LONG_CHARS_PER_TOKEN = 8
PIECE_CHARS = 2**16


class PromptTooLong(ValueError):
    """A prompt of more tokens than the model's context; nothing of it was prefilled."""

    def __init__(self, prompt_tokens: int, context_tokens: int):
        self.prompt_tokens = prompt_tokens
        self.context_tokens = context_tokens
        # Anthropic's own wording: Claude Code recognises it and offers to compact.
        super().__init__(f"prompt is too long: {prompt_tokens} tokens > {context_tokens} maximum")


def _field(source: Any, name: str) -> Any:
    return source.get(name) if isinstance(source, dict) else getattr(source, name, None)


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def context_length(model: Any, tokenizer: Any = None) -> int | None:
    """The model's context in tokens, from its loaded arguments (mlx-lm's `model.args`, or a
    multimodal model's `text_config`), capped by a set tokenizer limit; None when neither says."""
    arguments = getattr(model, "args", None)
    declared = None
    for source in (arguments, _field(arguments, "text_config")):
        declared = next((_positive(_field(source, name)) for name in CONTEXT_FIELDS if _positive(_field(source, name))), None)
        if declared:
            break
    inner = getattr(tokenizer, "_tokenizer", tokenizer)
    from_tokenizer = _positive(getattr(inner, "model_max_length", None))
    if from_tokenizer and from_tokenizer < UNSET_TOKENIZER_LENGTH:
        return min(declared, from_tokenizer) if declared else from_tokenizer
    return declared


def estimated_tokens_if_far_too_long(tokenizer: Any, text: str, context_tokens: int | None) -> int | None:
    """For a prompt text many times the context's length in characters (a paste, not a long conversation),
    the whole prompt's token count estimated from the pieces tokenized until they alone exceed the context
    clearly; None when the text is not that long or does fit (the caller then counts it exactly, as before).

    Tokenizing a 10 MB paste takes seconds to tens of seconds: its refusal should not wait for all of it.
    Pieces end at line breaks (no special token spans one), and each piece boundary may shift the count by
    a token or two, so "clearly" is with a margin of 5% and 16 tokens per piece.
    """
    if context_tokens is None or len(text) <= FAR_TOO_LONG_CHARS_PER_TOKEN * context_tokens:
        return None
    encode = getattr(tokenizer, "encode", None)
    if encode is None:
        return None
    counted = read = pieces = 0
    while read < len(text):
        end = min(len(text), read + PIECE_CHARS)
        if end < len(text):
            end = max(text.rfind("\n", read, end) + 1, read + PIECE_CHARS // 2)
        counted += len(encode(text[read:end], add_special_tokens=False))
        read, pieces = end, pieces + 1
        if counted > context_tokens * 1.05 + 16 * pieces:
            return round(counted * len(text) / read)
    return None


def check_prompt_fits(prompt_tokens: int, context_tokens: int | None) -> None:
    """Raise PromptTooLong for a prompt the context cannot hold (an unknown context holds any)."""
    if context_tokens is not None and prompt_tokens > context_tokens:
        raise PromptTooLong(prompt_tokens, context_tokens)
