"""The stable head of the request's chat prompt, carried to the generation.

The generation wrapper sees token ids only; where the system prompt and tools
end is known when the chat template renders the messages. vllm-mlx's own
system-prefix probe finds it for any template (it renders the system messages
with two different user messages and keeps what they share); install() runs
it for each chat request and hands its text over in a context variable,
evaluated only if the model needs checkpoints.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable

_head_text: contextvars.ContextVar[Callable[[], str | None] | None] = contextvars.ContextVar("prompt_head", default=None)


def set_head_text(compute: Callable[[], str | None]) -> contextvars.Token:
    return _head_text.set(compute)


def head_text() -> str | None:
    compute = _head_text.get()
    return compute() if compute else None
