"""The batched engine's seam of `admission.py`: `Scheduler.add_request`, where vllm-mlx tokenizes a prompt.

vllm-mlx's continuous-batching scheduler tokenizes each request in
`add_request` and queues it there for a place in the batch. The prompt is
tokenized here first, the way `add_request` would (it then skips that step),
and one the model's context cannot hold is refused before it is queued, so the
engine thread can never schedule it (a paste far beyond the context before it
is tokenized whole: `context_window.estimated_tokens_if_far_too_long`). The check runs in the request's own
context (`seams.py` keeps it by request id), so the HTTP layer learns
of the refusal at once. `Scheduler._schedule_waiting` says when each request
joins the batch: its wait in the queue is counted then. A client that
disconnects is vllm-mlx's own business here: the batched engine aborts the
request's prefill itself. Both wrappers are rows of the batched engine's seam
table (`seams.py`), which says what they wrap and in which order.
"""

from __future__ import annotations

import contextvars
import functools
from typing import Any

from stable_prefix.engine_patch.cache.context_window import context_length
from stable_prefix.engine_patch.http_api.admission import admit_prompt, record_start, refuse_if_far_too_long


def refuse_beyond_context(contexts: dict[str, contextvars.Context], add_request: Any) -> Any:
    """`Scheduler.add_request`, checking the prompt against the context first, in the request's own context."""

    @functools.wraps(add_request)
    def add_request_if_it_fits(scheduler: Any, request: Any) -> None:
        context = contexts.get(request.request_id)
        context.run(_check, scheduler, request) if context is not None else _check(scheduler, request)
        add_request(scheduler, request)

    return add_request_if_it_fits


def count_queue_waits(contexts: dict[str, contextvars.Context], schedule: Any) -> Any:
    """`Scheduler._schedule_waiting`, counting each request's wait in the queue once it has joined the batch."""

    @functools.wraps(schedule)
    def schedule_and_count_waits(scheduler: Any):
        scheduled = schedule(scheduler)
        for request in scheduled or ():
            context = contexts.get(request.request_id)
            if context is not None:
                context.run(record_start, len(request.prompt_token_ids or ()))
        return scheduled

    return schedule_and_count_waits


def _check(scheduler: Any, request: Any) -> None:
    """Refuse (PromptTooLong) a prompt the context cannot hold: a paste far beyond it before tokenizing it
    whole, any other once tokenized (its ids are kept, so `add_request` does not tokenize it again)."""
    context = context_length(scheduler.model, getattr(scheduler, "_actual_tokenizer", None))
    if request.prompt_token_ids is None and isinstance(request.prompt, str):
        refuse_if_far_too_long(_encoder(scheduler), request.prompt, context)
    tokens = _prompt_tokens(scheduler, request)
    if tokens is not None:
        request.prompt_token_ids, request.num_prompt_tokens = tokens, len(tokens)
        admit_prompt(len(tokens), context, starts_now=False)  # it starts when it joins the batch


def _encoder(scheduler: Any) -> Any:
    return scheduler.tokenizer if hasattr(scheduler.tokenizer, "encode") else getattr(scheduler.tokenizer, "tokenizer", None)


def _prompt_tokens(scheduler: Any, request: Any) -> list[int] | None:
    """The prompt's token ids as `Scheduler.add_request` makes them (None: it has a way of its own, left to it)."""
    if request.prompt_token_ids is not None:
        return list(request.prompt_token_ids)
    if not isinstance(request.prompt, str):
        return list(request.prompt)
    encoder = _encoder(scheduler)
    return encoder.encode(request.prompt) if hasattr(encoder, "encode") else None
