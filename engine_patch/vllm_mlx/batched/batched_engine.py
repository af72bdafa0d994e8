"""Our prefix cache inside one of vllm-mlx's continuous-batching schedulers (`--continuous-batching`).

`ServedScheduler` is what runs around the scheduler's methods where ours serves
its model (`why_not_served`: else vllm-mlx's own caches stay on, so no model gets
less reuse than shipped): right before a request joins mlx-lm's `BatchGenerator`
it is planned (`request_plan.py`: the longest stored prefix restored as its
cache, the rest left to prefill, where to checkpoint), or waits for a prefill
in flight that shares its prefix (`shared_prefill.py`); the generator's
prefills stop at the checkpoints and shared prefixes and are snapshotted there
between two steps (`batch_generator_access.py`); a finished sequence's state
(prompt and reply) is kept with its checkpoints, one that leaves early keeps
nothing. Which methods of vllm-mlx and mlx-lm are wrapped, by what and in which
order: the table in `seams.py`.
"""

from __future__ import annotations

import contextvars
import functools
import logging
from collections.abc import Callable
from typing import Any

from stable_prefix.engine_patch.cache.prompt_head import head_text
from stable_prefix.engine_patch.cache.request_plan import PrefixPlanner
from stable_prefix.engine_patch.cache.request_reuse import RequestReuse, current_request_reuse
from stable_prefix.engine_patch.cache.shared_prefill import Prefill, SharedPrefills, source_for
from stable_prefix.engine_patch.drafts.drafting import Drafting

from ..seam_table import Seam, put_on_objects
from . import batch_generator_access
from .drafted_decode import DraftedBatches

logger = logging.getLogger("engine_patch")


class PlannedTokens(list):
    """The prompt tokens left to prefill, carrying the request's planned prefill through
    vllm-mlx's scheduler (which passes them on as they are) to `BatchGenerator.insert`."""

    def __init__(self, tokens: list[int], prefill: Prefill, reuse: RequestReuse | None):
        super().__init__(tokens)
        self.prefill = prefill
        self.reuse = reuse


def why_not_served(planner: PrefixPlanner, model: Any, config: Any) -> str | None:
    """Why the batched engine must keep vllm-mlx's own cache for this model and configuration, or None."""
    if not planner.supports(model):
        return planner.unsupported_reasons()[-1]
    settings = {
        "KV cache quantization": getattr(config, "kv_cache_quantization", False),
        "--max-kv-size": (getattr(config, "max_kv_size", 0) or 0) > 0,
        "MTP": getattr(config, "enable_mtp", False),
        "the paged cache": getattr(config, "use_paged_cache", False),
        "chunked prefill": (getattr(config, "chunked_prefill_tokens", 0) or 0) > 0,
    }
    chosen = [name for name, on in settings.items() if on]
    return f"{', '.join(chosen)} builds caches ours does not serve" if chosen else None


class ServedScheduler:
    """Our cache in one `Scheduler`: its plans, its prefills in flight, its BatchGenerator's seams."""

    def __init__(self, scheduler: Any, planner: PrefixPlanner, contexts: dict[str, contextvars.Context], drafting: Drafting | None = None,
                 generator_rows: tuple[Seam, ...] = ()):
        self.scheduler = scheduler
        self.planner = planner
        self.contexts = contexts
        self.prefills = SharedPrefills()
        self.generator: Any = None
        self.segments_supported = True
        self.drafted = DraftedBatches(drafting, scheduler.model, scheduler._actual_tokenizer, full_prompt) if drafting is not None else None
        self.generator_rows = generator_rows  # seams.py's rows put on each generator this scheduler builds

    @property
    def model(self) -> Any:
        return self.scheduler.model

    @property
    def tokenizer(self) -> Any:
        return self.scheduler._actual_tokenizer

    # --- around the Scheduler's methods (seams.py's table): each gets the method there, bound, first -----------

    def around_schedule_waiting(self, schedule: Callable[[], Any]) -> Any:
        held = self.plan_waiting()
        try:
            return schedule()
        finally:
            self.scheduler.waiting.extendleft(reversed(held))

    def around_create_batch_generator(self, create: Callable[[Any], Any], sampling_params: Any) -> Any:
        generator = create(sampling_params)
        self.attach(generator)
        return generator

    def around_process_batch_responses(self, process: Callable[[list[Any]], Any], responses: list[Any]) -> Any:
        outputs_and_finished = process(responses)
        self.finished(responses)
        return outputs_and_finished

    def around_abort_request(self, abort: Callable[[str], Any], request_id: str) -> Any:
        uid = self.scheduler.request_id_to_uid.get(request_id)  # before the abort forgets it
        result = abort(request_id)
        self.left(request_id, uid)
        return result

    def around_close_batch_generator(self, close: Callable[[], Any]) -> None:
        close()
        self.prefills.clear()

    # --- the waiting queue ---------------------------------------------------

    def plan_waiting(self) -> list[Any]:
        """Plan the requests about to join the batch; take out (and return) those waiting for a shared prefill."""
        scheduler = self.scheduler
        capacity = scheduler.config.max_num_seqs - len(scheduler.running)
        # Planned and not inserted yet: sources too (requests of a fan-out group arrive together).
        planned = [request.remaining_tokens.prefill for request in scheduler.waiting if isinstance(request.remaining_tokens, PlannedTokens)]
        held = []
        for request in list(scheduler.waiting):
            if capacity <= 0:
                break
            if not isinstance(request.remaining_tokens, PlannedTokens):
                if self._waits_for_shared_prefill(request, planned):
                    scheduler.waiting.remove(request)
                    held.append(request)
                    continue
                prefill = self._plan(request)
                if prefill is not None:
                    planned.append(prefill)
            capacity -= 1
        return held

    def _plan(self, request: Any) -> Prefill | None:
        tokens = [int(token) for token in request.prompt_token_ids]
        context = self.contexts.get(request.request_id)
        head = functools.partial(context.run, head_text) if context else None
        plan = self.planner.plan(self.model, self.tokenizer, tokens, head)
        reuse = context.run(current_request_reuse) if context else None
        if reuse is not None:
            reuse.record(prompt_tokens=len(tokens), reused=plan.reused if plan else 0)
        if plan is None:
            return None  # restoring failed (counted): vllm-mlx prefills it all, uncached
        prefill = Prefill(plan)
        request.prompt_cache = plan.prompt_cache if plan.reused else None
        request.cached_tokens = plan.reused
        request.cache_hit_type = "hit" if plan.reused else "miss"
        request.remaining_tokens = PlannedTokens(tokens[plan.reused :], prefill, reuse)
        return prefill

    def _waits_for_shared_prefill(self, request: Any, planned: list[Prefill]) -> bool:
        if not self.segments_supported:
            return False
        candidates = [*self.prefills.by_uid.values(), *planned]
        if not candidates:
            return False
        tokens = request.prompt_token_ids
        positional = self.planner.is_positional(self.model)
        if source_for(candidates, tokens, 0, positional) is None:
            return False
        match = source_for(candidates, tokens, self.planner.cache.restorable_prefix(tokens, positional, self.model), positional)
        if match is None:
            return False
        prefill, shared = match
        if prefill.prefilled >= shared:
            # Rewindable (source_for said so): its state holds the prefix now.
            self._store_prefix(prefill)
            return False
        inserted = prefill.uid is not None
        if inserted and not batch_generator_access.add_stop(self.generator, prefill.uid, prefill.inserted, shared - prefill.plan.reused):
            return False
        if shared not in prefill.share_at:
            prefill.share_at.add(shared)
            logger.info("prefix cache: a request waits for the %d tokens it shares with a prefill %s", shared, "in flight" if inserted else "about to start")
        return True

    def _store_prefix(self, prefill: Prefill) -> None:
        """Keep what `prefill`'s sequence holds of its prompt now, for requests that share it."""
        state = batch_generator_access.state_of(self.generator, prefill.uid)
        if state is None:
            return
        length = min(prefill.prefilled, len(prefill.plan.tokens))
        self.planner.finish(prefill.plan, prefill.plan.tokens[:length], state, prompt_length=length)

    # --- the BatchGenerator ----------------------------------------------------

    def attach(self, generator: Any) -> None:
        """Route `generator`'s inserts and steps through this scheduler's plans and drafting: seams.py's rows run by
        ServedScheduler and DraftedBatches, put on it in the table's order (drafting's insert around ours)."""
        self.generator = generator
        self.prefills.clear()
        reason = batch_generator_access.why_unsupported(generator)
        self.segments_supported = reason is None
        if reason:
            logger.warning("engine_patch: %s; the batched engine takes no checkpoints and shares no prefill", reason)
            return
        if self.drafted is not None:
            self.drafted.attach(generator)
        put_on_objects(self.generator_rows, (generator, generator._generation_batch), runners={ServedScheduler: self, DraftedBatches: self.drafted})

    def _insert(self, original_insert, prompts, max_tokens=None, caches=None, all_tokens=None, samplers=None,
                logits_processors=None, state_machines=None):
        planned = [prompt if isinstance(prompt, PlannedTokens) else None for prompt in prompts]
        try:
            uids = batch_generator_access.insert(
                self.generator, prompts, [p.prefill.stops() if p else [] for p in planned], max_tokens=max_tokens, caches=caches,
                all_tokens=all_tokens, samplers=samplers, logits_processors=logits_processors, state_machines=state_machines,
            )
        except Exception as error:  # vllm-mlx retries the request without its cache
            for p in filter(None, planned):
                self.planner.fallback("insert", error, "vllm-mlx prefills this request uncached")
                if p.reuse is not None:
                    p.reuse.record(prompt_tokens=len(p.prefill.tokens), reused=0)
            raise
        for p, uid in zip(planned, uids):
            if p is not None:
                self.prefills.inserted(p.prefill, uid)
        return uids

    def _next(self, original_next):
        result = original_next()
        prompt_responses = result[0] if isinstance(result, tuple) else []
        for response in prompt_responses:
            prefill = self.prefills.by_uid.get(response.uid)
            if prefill is None:
                continue
            prefill.prefilled = prefill.plan.reused + response.progress[0]
            if response.end_of_segment and not response.end_of_prompt:
                self._stopped(prefill)
        return result

    def _stopped(self, prefill: Prefill) -> None:
        """A prefill stopped where it was asked to: checkpoint it, or keep the prefix others wait for."""
        position = prefill.prefilled
        checkpoint = position in prefill.plan.checkpoint_at
        shared = position in prefill.share_at
        if not (checkpoint or shared):
            return
        state = batch_generator_access.state_of(self.generator, prefill.uid)
        if state is None:
            return
        if checkpoint:
            try:
                self.planner.checkpoint(prefill.plan, state, position)
            except Exception as error:  # the batch's own state was only read: the request goes on as it is
                self.planner.fallback("checkpoint", error, f"no checkpoint at {position}")
        if shared:
            self.planner.finish(prefill.plan, prefill.plan.tokens[:position], state, prompt_length=position)

    # --- the end of a sequence ---------------------------------------------------

    def finished(self, responses: list[Any]) -> None:
        """Keep the state of each planned sequence that finished in this step (call before cleanup)."""
        scheduler = self.scheduler
        for response in responses:
            if response.finish_reason is None:
                continue
            prefill = self.prefills.pop(response.uid)
            request_id = scheduler.uid_to_request_id.get(response.uid)
            self.contexts.pop(request_id, None)
            request = scheduler.running.get(request_id)
            prompt_cache = response.prompt_cache() if callable(response.prompt_cache) else response.prompt_cache
            if prefill is None or request is None or not prompt_cache:
                continue
            # Every token reported was fed to the model: the cache holds the prompt and all of them.
            tokens = prefill.plan.tokens + [int(token) for token in request.output_token_ids]
            # The extracted cache is the sequence's own from here on: mlx-lm built it for this response
            # (slices of the batch's arrays, which MLX never writes into while shared), the batch goes on
            # without it and vllm-mlx's own prefix cache, the only other reader, is off. So it is kept
            # live (`live_lane.py`): the next turn of the lane takes it over instead of restoring the blocks;
            # joining a batch (`BatchKVCache.merge` and kin) copies it, read only.
            self.planner.finish(prefill.plan, tokens, prompt_cache, ends_request=True)

    def left(self, request_id: str, uid: int | None) -> None:
        if uid is not None:
            self.prefills.pop(uid)
        self.contexts.pop(request_id, None)


class ServedSchedulers:
    """Which schedulers ours serves: each one's ServedScheduler kept on the scheduler itself.

    A ServedScheduler holds its scheduler (and so the model); kept in a table of ours, even a
    WeakKeyDictionary (whose values are strong), it would keep every scheduler and model ever
    loaded alive, so vllm-mlx's unloads (`--auto-unload-idle-seconds`, `--lazy-load-model`)
    would free nothing. On the scheduler, the two form a cycle the garbage collector frees
    with the engine.
    """

    ATTRIBUTE = "_stable_prefix_served"

    def get(self, scheduler: Any) -> ServedScheduler | None:
        return getattr(scheduler, self.ATTRIBUTE, None)

    def __setitem__(self, scheduler: Any, served: ServedScheduler) -> None:
        setattr(scheduler, self.ATTRIBUTE, served)

    def __contains__(self, scheduler: Any) -> bool:
        return self.get(scheduler) is not None


def full_prompt(prompt: list[int]) -> list[int]:
    """A prompt as inserted into the generator, whole: a planned one carries the tokens its cache restored."""
    return list(prompt.prefill.plan.tokens) if isinstance(prompt, PlannedTokens) else list(prompt)
