"""mlx-lm's `stream_generate`, with the prompt prefix taken from a `PrefixCache`.

Every text generation vllm-mlx's SimpleEngine runs (streamed or not, with or
without tools, stop sequences, sampling parameters or logits processors) ends
in `mlx_lm.stream_generate(model, tokenizer, prompt, ...)`. Wrapping that one
function gives every request the cache while leaving decoding untouched: the
wrapped call gets the same sampler, processors and limits, and only its prompt
is shortened to the tokens the restored cache does not already hold.

For a model with positional layers (recurrent state, sliding windows) the
wrapper first prefills up to the prompt's checkpoint positions itself (see
`prompt_boundaries.py`), in generate_step's own chunks, snapshotting those
layers at each; generate_step then continues from the last one. The next
request that restores such a checkpoint continues from the very state this
request continued from.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.generate import generation_stream
from mlx_lm.models.cache import make_prompt_cache

from .cache_layers import UnsupportedCache, check_snapshot_support, eval_state, positional_indices, snapshot
from .prefix_cache import Checkpoint, Fetched, PrefixCache, common_prefix_length
from .prompt_boundaries import checkpoint_positions, generation_prompt_start, message_start_ids
from .prompt_head import head_text
from .request_reuse import current_request_reuse

logger = logging.getLogger("engine_patch")

# Keyword arguments that make generate_step build a different kind of cache
# (rotating or quantized) than the model's own: a snapshot of one must never
# serve the other. vllm-mlx 0.6.0 passes neither.
CACHE_CHANGING_OPTIONS = ("max_kv_size", "kv_bits")
# generate_step's default prefill chunk.
DEFAULT_PREFILL_STEP = 2048
MAX_HEADS_REMEMBERED = 8


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
        # Per model object: whether it has positional layers to checkpoint.
        self._positional: dict[int, bool] = {}
        # Requests that went uncached on purpose, by reason.
        self.bypassed: dict[str, int] = {}
        # Recently seen chat heads (text -> token ids), least recent first.
        self._head_tokens: dict[str, np.ndarray] = {}

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
        position, checkpoints, prompt_length = fetched.reused, [], len(tokens)
        if self._positional[id(model)]:
            # The next turn repeats the prompt up to its generation prompt (not
            # its thinking tail): an entry is superseded once another repeats that.
            prompt_length = generation_prompt_start(tokens, message_start_ids(tokenizer))
            try:
                position, checkpoints = self._prefill_to_checkpoints(model, tokenizer, tokens, fetched, kwargs)
            except Exception as error:  # the live cache is in an unknown state: answer uncached
                logger.warning("prefix cache checkpoint prefill failed (%r); this request runs uncached", error)
                self.cache.record_fallback(f"checkpoint: {error!r}")
                if reuse is not None:
                    reuse.record(prompt_tokens=len(tokens), reused=0)
                yield from self.original(model, tokenizer, prompt, max_tokens, **kwargs)
                return
        seen_tokens = list(tokens)
        failed = False
        try:
            for response in self.original(
                model,
                tokenizer,
                mx.array(tokens[position:]),
                max_tokens,
                prompt_cache=fetched.prompt_cache,
                **kwargs,
            ):
                seen_tokens.append(int(response.token))
                yield response
        except Exception:
            failed = True  # a step may have stopped between layers: the cache is not a state of any prefix
            raise
        finally:
            # Also when the caller stops early: each token reported was fed before it was yielded.
            if not failed:
                self._store(seen_tokens, fetched.prompt_cache, prompt_length, fetched.inherited + checkpoints)

    def _prefill_to_checkpoints(self, model, tokenizer, tokens: list[int], fetched: Fetched, kwargs) -> tuple[int, list[Checkpoint]]:
        """Prefill `fetched.prompt_cache` up to each checkpoint position, snapshotting its positional layers there."""
        head_length = self._head_length(tokenizer, tokens)
        positions = checkpoint_positions(
            tokens,
            message_start_ids(tokenizer),
            after=fetched.reused,
            head_length=head_length,
            diverges_at=fetched.common_prefix,
        )
        prompt_cache = fetched.prompt_cache
        positional = positional_indices(prompt_cache)
        step = kwargs.get("prefill_step_size") or DEFAULT_PREFILL_STEP
        position, checkpoints = fetched.reused, []
        for checkpoint_at in positions:
            # generate_step's prefill: chunks of `step`, state evaluated after each.
            with mx.stream(generation_stream):
                for start in range(position, checkpoint_at, step):
                    model(mx.array(tokens[start : min(start + step, checkpoint_at)])[None], cache=prompt_cache)
                    eval_state(prompt_cache)
            position = checkpoint_at
            layers, nbytes = snapshot(prompt_cache, positional)
            checkpoints.append(Checkpoint(position, layers, nbytes, pinned=position == head_length))
        if checkpoints:
            logger.info("prefix cache checkpoints at %s", ", ".join(str(c.position) for c in checkpoints))
        return position, checkpoints

    def _head_length(self, tokenizer, tokens: list[int]) -> int | None:
        try:
            text = head_text()
        except Exception:  # the probe renders the template; any failure just means no head checkpoint
            return None
        if not text:
            return None
        # Lanes share a handful of heads of ~20K tokens: encode each once.
        head = self._head_tokens.pop(text, None)
        if head is None:
            head = np.asarray(prompt_token_ids(tokenizer, text), dtype=np.int64)
        self._head_tokens[text] = head
        while len(self._head_tokens) > MAX_HEADS_REMEMBERED:
            self._head_tokens.pop(next(iter(self._head_tokens)))
        # The last token or two of a text prefix may merge differently; keep what agrees.
        return common_prefix_length(head, np.asarray(tokens, dtype=np.int64)) or None

    def _applies(self, model, draft_model, kwargs: dict[str, Any]) -> bool:
        if kwargs.get("prompt_cache") is not None:
            return False  # a caller with its own cache (vllm-mlx's system-prefix cache, for a model we do not serve)
        reason = "draft model" if draft_model is not None else next(
            (option for option in CACHE_CHANGING_OPTIONS if kwargs.get(option) is not None), None
        )
        if reason:
            self.bypassed[reason] = self.bypassed.get(reason, 0) + 1
            return False
        return self.supports(model)

    def supports(self, model) -> bool:
        """Whether this model's cache can be snapshotted (decided once per model, logged if not)."""
        if id(model) not in self._unsupported:
            self._unsupported[id(model)] = None
            try:
                prompt_cache = make_prompt_cache(model)
                check_snapshot_support(prompt_cache)
                self._positional[id(model)] = bool(positional_indices(prompt_cache))
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

    def _store(self, tokens: list[int], prompt_cache: list[Any], prompt_length: int, checkpoints: list[Checkpoint]) -> None:
        try:
            self.cache.store(tokens, prompt_cache, prompt_length, checkpoints)
        except Exception as error:  # the answer is already out; only reuse is lost
            logger.warning("prefix cache snapshot failed (%r); nothing stored for this request", error)
            self.cache.record_fallback(f"snapshot: {error!r}")
