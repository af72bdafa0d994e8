"""The SimpleEngine seams of `admission.py`: `mlx_lm.stream_generate`, before the cache sees the prompt,
and vllm-mlx's `MLXLanguageModel.stream_generate`, where a text far longer than the context is refused
before vllm-mlx tokenizes it whole to count it (seconds for a multi-megabyte paste).

Every SimpleEngine text generation ends in `mlx_lm.stream_generate` (see
`cached_generation.py`), so wrapping it outermost gives each request, cached or
not, the two checks: its prompt is tokenized once here (with mlx-lm's own rule;
the token ids go down instead of the text, so nothing below tokenizes it
again) and refused if the model's context cannot hold it; and generate_step's
`prompt_progress_callback`, called after each prefill chunk, stops the
generation when the request's client has gone.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any

from stable_prefix.engine_patch.cache.context_window import context_length
from stable_prefix.engine_patch.cache.request_plan import prompt_token_ids
from stable_prefix.engine_patch.http_api.admission import ClientGone, admit_prompt, refuse_if_far_too_long, stop_if_client_gone

logger = logging.getLogger("engine_patch")


class AdmittedGeneration:
    """A drop-in `stream_generate` that refuses prompts beyond the context and stops abandoned prefills."""

    def __init__(self, generate: Callable[..., Iterator[Any]]):
        functools.update_wrapper(self, generate, updated=())  # `__wrapped__`: what it runs around
        self.generate = generate
        self._contexts: dict[int, int | None] = {}  # per model object

    def __call__(self, model, tokenizer, prompt, max_tokens: int = 256, **kwargs):
        tokens = prompt_token_ids(tokenizer, prompt)
        if id(model) not in self._contexts:
            self._contexts[id(model)] = context_length(model, tokenizer)
        admit_prompt(len(tokens), self._contexts[id(model)])
        kwargs["prompt_progress_callback"] = _stopping(kwargs.get("prompt_progress_callback"))
        try:
            yield from self.generate(model, tokenizer, tokens, max_tokens, **kwargs)
        except ClientGone as gone:
            logger.info("engine_patch: prefill stopped: %s", gone)


def _stopping(callback: Callable[[int, int], None] | None) -> Callable[[int, int], None]:
    def progress(processed: int, total: int) -> None:
        if callback is not None:
            callback(processed, total)
        stop_if_client_gone(processed, total)

    return progress


def refusing_far_too_long(stream_generate: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    """vllm-mlx's `MLXLanguageModel.stream_generate`, refusing a text far beyond the context before it is tokenized
    (a row of `seams.py`'s table)."""

    @functools.wraps(stream_generate)
    def stream_generate_unless_far_too_long(self, prompt, *args, **kwargs):
        if isinstance(prompt, str):
            refuse_if_far_too_long(self.tokenizer, prompt, context_length(self.model, self.tokenizer))
        yield from stream_generate(self, prompt, *args, **kwargs)

    return stream_generate_unless_far_too_long
