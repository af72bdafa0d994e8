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


def check_prompt_fits(prompt_tokens: int, context_tokens: int | None) -> None:
    """Raise PromptTooLong for a prompt the context cannot hold (an unknown context holds any)."""
    if context_tokens is not None and prompt_tokens > context_tokens:
        raise PromptTooLong(prompt_tokens, context_tokens)
