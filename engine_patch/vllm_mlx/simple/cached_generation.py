"""mlx-lm's `stream_generate`, with the prompt prefix taken from the prefix cache.

Every text generation vllm-mlx's SimpleEngine runs (streamed or not, with or
without tools, stop sequences, sampling parameters or logits processors) ends
in `mlx_lm.stream_generate(model, tokenizer, prompt, ...)`. Wrapping that one
function gives every request the cache while leaving decoding untouched: the
wrapped call gets the same sampler, processors and limits, and only its prompt
is shortened to the tokens the restored cache does not already hold.

For a model with positional layers (recurrent state, sliding windows) the
wrapper first prefills up to the prompt's checkpoint positions itself (see
`request_plan.py`), in generate_step's own chunks, snapshotting those layers at
each; generate_step then continues from the last one. The next request that
restores such a checkpoint continues from the very state this request
continued from.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any

import mlx.core as mx
from mlx_lm.generate import generation_stream

from stable_prefix.engine_patch.cache.cache_layers import eval_state
from stable_prefix.engine_patch.cache.prompt_head import head_text
from stable_prefix.engine_patch.cache.ram_tier import RamTier
from stable_prefix.engine_patch.cache.request_plan import PrefixPlanner, RequestPlan, prompt_token_ids
from stable_prefix.engine_patch.cache.request_reuse import current_request_reuse
from stable_prefix.engine_patch.http_api.admission import ClientGone, stop_if_client_gone

logger = logging.getLogger("engine_patch")

# Keyword arguments that make generate_step build a different kind of cache
# (rotating or quantized) than the model's own: a snapshot of one must never
# serve the other. vllm-mlx 0.6.0 passes neither.
CACHE_CHANGING_OPTIONS = ("max_kv_size", "kv_bits")
# generate_step's default prefill chunk.
DEFAULT_PREFILL_STEP = 2048


class CachedGeneration:
    """A drop-in `stream_generate` that reuses and refills the prefix cache."""

    def __init__(self, original: Callable[..., Iterator[Any]], cache: RamTier, planner: PrefixPlanner | None = None):
        functools.update_wrapper(self, original, updated=())  # `__wrapped__`: what it runs around
        self.original = original
        self.planner = planner or PrefixPlanner(cache)
        self.cache = self.planner.cache

    @property
    def bypassed(self) -> dict[str, int]:
        return self.planner.bypassed

    def supports(self, model) -> bool:
        return self.planner.supports(model)

    def unsupported_reasons(self) -> list[str]:
        return self.planner.unsupported_reasons()

    def __call__(self, model, tokenizer, prompt, max_tokens: int = 256, draft_model=None, **kwargs):
        if not self._applies(model, draft_model, kwargs):
            yield from self.original(model, tokenizer, prompt, max_tokens, draft_model=draft_model, **kwargs)
            return
        tokens = prompt_token_ids(tokenizer, prompt)
        plan = self.planner.plan(model, tokenizer, tokens, head_text)
        reuse = current_request_reuse()
        if reuse is not None:
            reuse.record(prompt_tokens=len(tokens), reused=plan.reused if plan else 0)
        if plan is None:
            yield from self.original(model, tokenizer, prompt, max_tokens, **kwargs)
            return
        try:
            position = self._prefill_to_checkpoints(model, plan, kwargs.get("prefill_step_size") or DEFAULT_PREFILL_STEP)
        except ClientGone:
            raise  # nobody waits for this answer (AdmittedGeneration, outermost, ends the request)
        except Exception as error:  # the live cache is in an unknown state: answer uncached
            self.planner.fallback("checkpoint prefill", error, "this request runs uncached")
            if reuse is not None:
                reuse.record(prompt_tokens=len(tokens), reused=0)
            yield from self.original(model, tokenizer, prompt, max_tokens, **kwargs)
            return
        seen_tokens = list(tokens)
        failed = False
        responses = self.original(model, tokenizer, mx.array(tokens[position:]), max_tokens, prompt_cache=plan.prompt_cache, **kwargs)
        try:
            for response in responses:
                seen_tokens.append(int(response.token))
                yield response
        except Exception:
            failed = True  # a step may have stopped between layers: the cache is not a state of any prefix
            raise
        finally:
            # Closed first, so the generation below leaves its cache settled (a drafted decode rolls back
            # the tokens it fed but never yielded); also when the caller stops early.
            responses.close()
            if not failed:
                self.planner.finish(plan, seen_tokens, plan.prompt_cache)

    def _prefill_to_checkpoints(self, model, plan: RequestPlan, step: int) -> int:
        """Prefill the plan's live cache up to each checkpoint position, snapshotting there; the position reached."""
        position = plan.reused
        for checkpoint_at in plan.checkpoint_at:
            # generate_step's prefill: chunks of `step`, state evaluated after each.
            with mx.stream(generation_stream):
                for start in range(position, checkpoint_at, step):
                    end = min(start + step, checkpoint_at)
                    model(mx.array(plan.tokens[start:end])[None], cache=plan.prompt_cache)
                    eval_state(plan.prompt_cache)
                    stop_if_client_gone(end, len(plan.tokens))
            position = checkpoint_at
            self.planner.checkpoint(plan, plan.prompt_cache, position)
        if plan.checkpoints:
            logger.info("prefix cache checkpoints at %s", ", ".join(str(c.position) for c in plan.checkpoints))
        return position

    def _applies(self, model, draft_model, kwargs: dict[str, Any]) -> bool:
        if kwargs.get("prompt_cache") is not None:
            return False  # a caller with its own cache (vllm-mlx's system-prefix cache, for a model we do not serve)
        reason = "draft model" if draft_model is not None else next(
            (option for option in CACHE_CHANGING_OPTIONS if kwargs.get(option) is not None), None
        )
        if reason:
            self.planner.bypass(reason)
            return False
        return self.planner.supports(model)
