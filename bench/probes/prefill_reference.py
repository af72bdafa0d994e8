"""How long a server takes to prefill N tokens from nothing: the first yardstick
for "warm TTFT <= 1.3x the time to prefill only the new tokens" (reported as
"vs cold prefill of N tokens from nothing"). It is unreachable when attention
dominates: a warm request's new tokens attend over the whole cached context.
The fair one, new tokens on top of the reused prefix, is `bench.probes.incontext_prefill`.

After a configuration's replay, a few one-message prompts of known sizes are
sent straight to its engine, each after `DELETE /v1/cache` and each with text
no earlier prompt shares, so every token is prefilled. A warm request's TTFT is
then compared with the interpolated time for its own number of prefilled tokens.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable

import numpy as np

from stable_prefix.bench.clients.replay import CHAT_COMPLETIONS_PATH, MESSAGES_PATH, post_streamed
from stable_prefix.bench.workload.prompt_tokens import PromptRenderer
from stable_prefix.bench.workload.session import TextSource

SIZES = (32, 256, 1024, 4096)


def reference_body(tokens: int, model: str, seed: int) -> dict:
    text = TextSource(random.Random(f"prefill-reference-{seed}"), 1.0).prose(tokens)
    return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 2, "stream": True}


def measure(
    server_url: str, renderer: PromptRenderer, model: str, clear_cache: Callable[[], bool], sizes: tuple[int, ...] = SIZES, protocol: str = "anthropic"
) -> list[tuple[int, float]]:
    """[(prompt tokens, TTFT in s)] for cold prompts of about `sizes` tokens, each after
    `clear_cache()` (text no other prompt shares, so a server that cannot empty its cache
    has nothing to reuse either)."""
    points = []
    for seed, size in enumerate(sizes):
        body = reference_body(size, model, seed)
        clear_cache()
        if protocol == "openai":
            path, sent = CHAT_COMPLETIONS_PATH, {key: value for key, value in body.items() if key != "model"}
        else:
            path, sent = MESSAGES_PATH, body
        reply = post_streamed(server_url, path, json.dumps(sent).encode())
        if reply.status != 200:
            raise RuntimeError(f"prefill reference: {size}-token prompt to {server_url} failed: {reply.error}")
        points.append((len(renderer.token_ids(body)), reply.ttft_s))
    return points


def prefill_seconds(reference: list[tuple[int, float]], tokens: int) -> float:
    """Cold-prefill time for `tokens`: linear between measured sizes, the last
    segment's slope beyond the largest (an underestimate: attention grows faster)."""
    sizes, seconds = zip(*sorted(reference))
    if tokens <= sizes[-1]:
        return float(np.interp(tokens, sizes, seconds))
    slope = (seconds[-1] - seconds[-2]) / (sizes[-1] - sizes[-2])
    return seconds[-1] + slope * (tokens - sizes[-1])
