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
from .cached_generation import prompt_token_ids
from .context_window import PromptTooLong, context_length

logger = logging.getLogger("engine_patch")


class AdmittedGeneration:
    """A drop-in `stream_generate` that refuses prompts beyond the context and stops abandoned prefills."""

    def __init__(self, generate: Callable[..., Iterator[Any]]):
        self.generate = generate
        self.refused = 0
        self.prefills_stopped = 0
        self.prefill_tokens_skipped = 0
        self._contexts: dict[int, int | None] = {}  # per model object

    def __call__(self, model, tokenizer, prompt, max_tokens: int = 256, **kwargs):
        tokens = prompt_token_ids(tokenizer, prompt)
        if id(model) not in self._contexts:
            self._contexts[id(model)] = context_length(model, tokenizer)
        try:
            admit_prompt(len(tokens), self._contexts[id(model)])
        except PromptTooLong:
            self.refused += 1
            raise
        kwargs["prompt_progress_callback"] = self._stopping_callback(kwargs.get("prompt_progress_callback"))
        try:
            yield from self.generate(model, tokenizer, tokens, max_tokens, **kwargs)
        except ClientGone:
            logger.info("engine_patch: client gone during the prefill of a %d-token prompt; stopped", len(tokens))

    def _stopping_callback(self, callback: Callable[[int, int], None] | None) -> Callable[[int, int], None]:
        def progress(processed: int, total: int) -> None:
            if callback is not None:
                callback(processed, total)
            try:
                stop_if_client_gone()
            except ClientGone:
                self.prefills_stopped += 1
                self.prefill_tokens_skipped += total - processed
                raise

        return progress

    def stats(self) -> dict[str, Any]:
        return {"prompts_refused": self.refused, "prefills_stopped": self.prefills_stopped,
                "prefill_tokens_skipped": self.prefill_tokens_skipped,
                "context_tokens": next(iter(self._contexts.values()), None)}
