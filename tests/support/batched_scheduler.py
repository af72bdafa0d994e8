"""vllm-mlx's continuous-batching scheduler in process, with and without our cache.

A test drives `Scheduler.step()` itself and adds requests at chosen steps, so
several sequences are in flight at once exactly as in a server, without HTTP
and without starting one. `batched_seams` installs the batched engine's seams
and puts every patched class back afterwards.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass

from stable_prefix.engine_patch.cache.kv_blocks import BLOCK_TOKENS
from stable_prefix.engine_patch.cache.prompt_head import set_head_text
from stable_prefix.engine_patch.cache.ram_tier import RamTier
from stable_prefix.engine_patch.cache.request_plan import PrefixPlanner
from stable_prefix.engine_patch.cache.request_reuse import begin_request, current_request_reuse
from stable_prefix.engine_patch.drafts.drafting import Drafting
from stable_prefix.engine_patch.vllm_mlx.batched.seams import BatchedEngineSeams

MAX_STEPS = 20_000


@dataclass(frozen=True)
class Arrival:
    step: int  # added before this step runs
    request_id: str
    prompt: str
    max_tokens: int = 8
    head: str | None = None  # the chat head a server's chat route would hand over
    temperature: float = 0.0
    min_p: float = 0.0  # sampled arrivals keep only tokens this close to the likeliest (top-p off)
    repetition_penalty: float = 1.0  # other than 1: a logits processor on this request


@dataclass
class Served:
    tokens: dict[str, list[int]]
    cached_tokens: dict[str, int]  # what the scheduler was told each request restored
    reported: dict[str, int | None]  # what each request's usage would say it reused (with seams)


def submitted(head: str | None) -> contextvars.Context:
    def fresh_request() -> contextvars.Context:
        begin_request()
        if head is not None:
            set_head_text(lambda: head)
        return contextvars.copy_context()

    return contextvars.Context().run(fresh_request)


def patched_classes():
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.models.cache import ArraysCache
    from vllm_mlx import engine_core, scheduler
    from vllm_mlx.engine import batched

    return scheduler.Scheduler, engine_core.EngineCore, batched.BatchedEngine, ArraysCache, BatchGenerator


@contextlib.contextmanager
def batched_seams(budget_bytes: int = 256 * 2**20, block_tokens: int = BLOCK_TOKENS, drafting: Drafting | None = None) -> Iterator[BatchedEngineSeams]:
    """The batched engine's seams (every row of its table: mlx-lm's recurrent padding fix and the admission
    check too) on a fresh RAM cache (and `drafting`, if given), as install() puts them; the classes as shipped
    again afterwards."""
    saved = [(cls, dict(vars(cls))) for cls in patched_classes()]
    seams = BatchedEngineSeams(PrefixPlanner(RamTier(budget_bytes=budget_bytes, block_tokens=block_tokens)), drafting)
    seams.install()
    try:
        yield seams
    finally:
        for cls, attributes in saved:
            for name in [name for name in vars(cls) if name not in attributes]:
                delattr(cls, name)
            for name, value in attributes.items():
                if vars(cls).get(name) is not value:
                    setattr(cls, name, value)


def scheduler(model, tokenizer, **config):
    from vllm_mlx.scheduler import Scheduler, SchedulerConfig

    return Scheduler(model, tokenizer, SchedulerConfig(**{"enable_prefix_cache": False, **config}))


def serve(scheduler, arrivals: list[Arrival], seams: BatchedEngineSeams | None = None) -> Served:
    """Greedy tokens of each request, its arrival at its step; the scheduler runs until all are done.

    With `seams`, each request is submitted as a server submits it: in a context
    of its own that carries its reuse record and its chat head.
    """
    from vllm_mlx.request import Request, SamplingParams

    pending = sorted(arrivals, key=lambda arrival: arrival.step)
    contexts: dict[str, contextvars.Context] = {}
    tokens: dict[str, list[int]] = {arrival.request_id: [] for arrival in arrivals}
    for step in range(MAX_STEPS):
        while pending and pending[0].step <= step:
            arrival = pending.pop(0)
            params = SamplingParams(max_tokens=arrival.max_tokens, temperature=arrival.temperature, top_p=1.0, min_p=arrival.min_p,
                                    repetition_penalty=arrival.repetition_penalty)
            if seams is not None:
                seams.contexts[arrival.request_id] = contexts[arrival.request_id] = submitted(arrival.head)
            scheduler.add_request(Request(request_id=arrival.request_id, prompt=arrival.prompt, sampling_params=params))
        if not pending and not scheduler.has_requests():
            break
        for output in scheduler.step().outputs:
            tokens[output.request_id] += list(output.new_token_ids)
    else:
        raise AssertionError(f"the scheduler did not finish {len(arrivals)} requests in {MAX_STEPS} steps")
    cached = {request_id: scheduler.requests[request_id].cached_tokens for request_id in tokens if request_id in scheduler.requests}
    reported = {request_id: context.run(current_request_reuse).reused for request_id, context in contexts.items()}
    return Served(tokens, cached, reported)


def served_without_our_cache(model, tokenizer, arrivals: list[Arrival], prefill_step_size: int) -> Served:
    """The same batched engine without our cache: what every batched test compares with. For models with recurrent
    layers one prompt per prefill: as shipped, vllm-mlx's default of 8 lets mlx-lm 0.31 feed the right padding of
    shorter prompts into their recurrent state (tests/engine_patch/vllm_mlx/test_recurrent_padding_fix.py), which
    ours avoids."""
    from mlx_lm.models.cache import make_prompt_cache

    from stable_prefix.engine_patch.cache.cache_layers import has_recurrent_state

    one_at_a_time = has_recurrent_state(make_prompt_cache(model))
    return serve(scheduler(model, tokenizer, prefill_step_size=prefill_step_size, prefill_batch_size=1 if one_at_a_time else 8),
                 arrivals)
