"""The SimpleEngine seam of `admission.py`: `mlx_lm.stream_generate`, before the cache sees the prompt.

Every SimpleEngine text generation ends in `mlx_lm.stream_generate` (see
`cached_generation.py`), so wrapping it outermost gives each request, cached or
not, the two checks: its prompt is tokenized once here (with mlx-lm's own rule;
the token ids go down instead of the text, so nothing below tokenizes it
again) and refused if the model's context cannot hold it; and generate_step's
`prompt_progress_callback`, called after each prefill chunk, stops the
generation when the request's client has gone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from .admission import ClientGone, admit_prompt, stop_if_client_gone
from .context_window import context_length
from .request_plan import prompt_token_ids

logger = logging.getLogger("engine_patch")


class AdmittedGeneration:
    """A drop-in `stream_generate` that refuses prompts beyond the context and stops abandoned prefills."""

    def __init__(self, generate: Callable[..., Iterator[Any]]):
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
