"""mlx-lm's `stream_generate`, with the prompt prefix taken from a `PrefixCache`.

Every text generation vllm-mlx's SimpleEngine runs (streamed or not, with or
without tools, stop sequences, sampling parameters or logits processors) ends
in `mlx_lm.stream_generate(model, tokenizer, prompt, ...)`. Wrapping that one
function gives every request the cache while leaving decoding untouched: the
wrapped call gets the same sampler, processors and limits, and only its prompt
is shortened to the tokens the restored cache does not already hold.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from .cache_layers import UnsupportedCache, check_snapshot_support
from .prefix_cache import PrefixCache
from .request_reuse import current_request_reuse

logger = logging.getLogger("engine_patch")

# Keyword arguments that make generate_step build a different kind of cache
# (rotating or quantized) than the plain one a snapshot can restore.
CACHE_CHANGING_OPTIONS = ("max_kv_size", "kv_bits")


def prompt_token_ids(tokenizer: Any, prompt: str | list[int] | mx.array) -> list[int]:
    """The token ids mlx-lm would prefill for `prompt` (same special-token rule)."""
    if isinstance(prompt, str):
        bos_token = getattr(tokenizer, "bos_token", None)
        add_special_tokens = bos_token is None or not prompt.startswith(bos_token)
        return list(tokenizer.encode(prompt, add_special_tokens=add_special_tokens))
    if isinstance(prompt, mx.array):
        return [int(token) for token in prompt.tolist()]
    return [int(token) for token in prompt]


class CachedGeneration:
    """A drop-in `stream_generate` that reuses and refills a `PrefixCache`."""

    def __init__(self, original: Callable[..., Iterator[Any]], cache: PrefixCache):
        self.original = original
        self.cache = cache
        # Per model object: why its cache cannot be snapshotted, or None.
        self._unsupported: dict[int, str | None] = {}

    def __call__(self, model, tokenizer, prompt, max_tokens: int = 256, draft_model=None, **kwargs):
        if not self._applies(model, draft_model, kwargs):
            yield from self.original(model, tokenizer, prompt, max_tokens, draft_model=draft_model, **kwargs)
            return
        tokens = prompt_token_ids(tokenizer, prompt)
        fetched = self._fetch(model, tokens)
        reuse = current_request_reuse()
        if reuse is not None:
            reuse.record(prompt_tokens=len(tokens), reused=fetched.reused if fetched else 0)
        if fetched is None:
            yield from self.original(model, tokenizer, prompt, max_tokens, **kwargs)
            return
        logger.info(
            "prefix cache %s: %d prompt tokens, %d reused, %d to prefill",
            "HIT" if fetched.reused else "MISS",
            len(tokens),
            fetched.reused,
            len(tokens) - fetched.reused,
        )
        seen_tokens = list(tokens)
        try:
            for response in self.original(
                model,
                tokenizer,
                mx.array(tokens[fetched.reused :]),
                max_tokens,
                prompt_cache=fetched.prompt_cache,
                **kwargs,
            ):
                seen_tokens.append(int(response.token))
                yield response
        finally:
            self._store(seen_tokens, fetched.prompt_cache, prompt_length=len(tokens))

    def _applies(self, model, draft_model, kwargs: dict[str, Any]) -> bool:
        if draft_model is not None or kwargs.get("prompt_cache") is not None:
            return False  # speculative decoding, or a caller with its own cache
        if any(kwargs.get(option) is not None for option in CACHE_CHANGING_OPTIONS):
            return False
        if id(model) not in self._unsupported:
            self._unsupported[id(model)] = None
            try:
                check_snapshot_support(make_prompt_cache(model))
            except UnsupportedCache as reason:
                self._unsupported[id(model)] = str(reason)
                logger.warning("prefix cache disabled for %s: %s", type(model).__name__, reason)
        return self._unsupported[id(model)] is None

    def unsupported_reasons(self) -> list[str]:
        return [reason for reason in self._unsupported.values() if reason]

    def _fetch(self, model, tokens: list[int]):
        try:
            return self.cache.fetch(model, tokens)
        except Exception as error:  # a cache fault must never fail the request
            logger.warning("prefix cache restore failed (%r); this request runs uncached", error)
            self.cache.record_fallback(f"restore: {error!r}")
            return None

    def _store(self, tokens: list[int], prompt_cache: list[Any], prompt_length: int) -> None:
        try:
            self.cache.store(tokens, prompt_cache, prompt_length)
        except Exception as error:  # the answer is already out; only reuse is lost
            logger.warning("prefix cache snapshot failed (%r); nothing stored for this request", error)
            self.cache.record_fallback(f"snapshot: {error!r}")
