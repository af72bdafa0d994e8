"""Which request a generation belongs to, across the engine's worker thread.

The server answers on its event loop while the generation runs on the engine's
single worker thread, so the number of tokens a request reused is known on one
side and reported on the other. A context variable carries a per-request record
across: the HTTP layer sets it, the engine's worker submissions run inside a
copy of the submitting context, and the generation fills it in.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass


@dataclass
class RequestReuse:
    prompt_tokens: int | None = None
    reused: int | None = None

    def record(self, prompt_tokens: int, reused: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.reused = reused


_current: contextvars.ContextVar[RequestReuse | None] = contextvars.ContextVar("request_reuse", default=None)


def current_request_reuse() -> RequestReuse | None:
    return _current.get()


def begin_request() -> tuple[RequestReuse, contextvars.Token]:
    reuse = RequestReuse()
    return reuse, _current.set(reuse)


def end_request(token: contextvars.Token) -> None:
    _current.reset(token)
