"""The batched engine's seam of `admission.py`: `Scheduler.add_request`, where vllm-mlx tokenizes a prompt.

vllm-mlx's continuous-batching scheduler tokenizes each request in
`add_request` and queues it there for a place in the batch. The prompt is
tokenized here first, the way `add_request` would (it then skips that step),
and one the model's context cannot hold is refused before it is queued, so the
engine thread can never schedule it. The check runs in the request's own
context (`batched_engine.py` keeps it by request id), so the HTTP layer learns
of the refusal at once. A client that disconnects is vllm-mlx's own business
here: the batched engine aborts the request's prefill itself.
"""

from __future__ import annotations

import contextvars
import functools
from typing import Any

from .admission import admit_prompt
from .context_window import context_length


def install(contexts: dict[str, contextvars.Context]) -> list[str]:
    from vllm_mlx.scheduler import Scheduler

    add_request = getattr(Scheduler, "add_request", None)
    if add_request is None:
        return []

    @functools.wraps(add_request)
    def add_request_if_it_fits(scheduler: Any, request: Any) -> None:
        tokens = _prompt_tokens(scheduler, request)
        if tokens is not None:
            request.prompt_token_ids, request.num_prompt_tokens = tokens, len(tokens)
            check = functools.partial(admit_prompt, len(tokens),
                                      context_length(scheduler.model, getattr(scheduler, "_actual_tokenizer", None)))
            context = contexts.get(request.request_id)
            context.run(check) if context is not None else check()
        add_request(scheduler, request)

    Scheduler.add_request = add_request_if_it_fits
    return ["batched Scheduler.add_request (context check)"]


def _prompt_tokens(scheduler: Any, request: Any) -> list[int] | None:
    """The prompt's token ids as `Scheduler.add_request` makes them (None: it has a way of its own, left to it)."""
    if request.prompt_token_ids is not None:
        return list(request.prompt_token_ids)
    if not isinstance(request.prompt, str):
        return list(request.prompt)
    encoder = scheduler.tokenizer if hasattr(scheduler.tokenizer, "encode") else getattr(scheduler.tokenizer, "tokenizer", None)
    return encoder.encode(request.prompt) if hasattr(encoder, "encode") else None
