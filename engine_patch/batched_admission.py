"""The batched engine's seam of `admission.py`: `Scheduler.add_request`, where vllm-mlx tokenizes a prompt.

vllm-mlx's continuous-batching scheduler tokenizes each request in
`add_request`, before the request waits for a place in the batch; a prompt the
model's context cannot hold is refused right there, before any prefill, and
`EngineCore.add_request` (its caller) takes the request back out of the
queue. The check runs in the request's own context (`batched_engine.py` keeps
it by request id), so the HTTP layer learns of the refusal at once. A client
that disconnects is vllm-mlx's own business here: the batched engine aborts
the request's prefill itself.
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
        add_request(scheduler, request)
        if request.prompt_token_ids is None:
            return  # a multimodal request: tokenized elsewhere
        check = functools.partial(admit_prompt, len(request.prompt_token_ids),
                                  context_length(scheduler.model, getattr(scheduler, "_actual_tokenizer", None)))
        context = contexts.get(request.request_id)
        context.run(check) if context is not None else check()

    Scheduler.add_request = add_request_if_it_fits
    return ["batched Scheduler.add_request (context check)"]
