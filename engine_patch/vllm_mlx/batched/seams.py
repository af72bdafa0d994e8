"""Every seam of the batched engine in one table (`seam_table`), and the one `install()` that puts them in.

vllm-mlx 0.6.0's continuous-batching engine renders a chat request
(`BatchedEngine`), carries it to its engine thread (`EngineCore`), tokenizes it
in `Scheduler.add_request` and, at a later step, inserts it into mlx-lm's
`BatchGenerator`, which prefills and decodes every sequence in flight together.
Each row of the table wraps one of their methods, named by reference (the
method as shipped), with what runs around it and why.

The order of wrappers is the table's (`seam_table.py`, the mechanics both
engines' tables share): rows are put in top to bottom, and a row on an
attribute an earlier row already wrapped wraps that wrapper, so it runs first
and calls the earlier one. Two attributes are wrapped twice:
- `Scheduler._schedule_waiting`: the queue-wait count (admission) around the
  plan (the cache): requests are planned, join the batch, then each one's wait
  is counted;
- `BatchGenerator.insert`, on each generator a served scheduler builds: the
  draft sessions around the segmented insert (a session opens once its row has
  a uid).
`tests/engine_patch/vllm_mlx/test_batched_seams.py` reads the installed classes
and generators and fails on any replaced attribute not in the table, or
wrapped in another order.

The rows run by `ServedScheduler` or `DraftedBatches` are put on each
generator a served scheduler builds (`ServedScheduler.attach`, by the same
mechanics), not on the class: a scheduler ours does not serve keeps mlx-lm's
generator as shipped.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import logging
import uuid
from collections.abc import Callable
from typing import Any

from stable_prefix.engine_patch.cache.prompt_head import set_head_text
from stable_prefix.engine_patch.cache.request_plan import PrefixPlanner
from stable_prefix.engine_patch.drafts.drafting import Drafting

from ..seam_table import Patch, Seam, labels, put_in
from . import batched_admission, recurrent_padding_fix
from .batched_engine import ServedScheduler, ServedSchedulers, why_not_served
from .drafted_decode import DraftedBatches

logger = logging.getLogger("engine_patch")


def seam_table(seams: BatchedEngineSeams) -> tuple[Seam, ...]:
    """The batched engine's seams, in the order they are put in (vllm-mlx imported here, at install)."""
    from mlx_lm.generate import BatchGenerator, GenerationBatch
    from vllm_mlx.engine.batched import BatchedEngine
    from vllm_mlx.engine_core import EngineCore
    from vllm_mlx.scheduler import Scheduler

    served, contexts = seams.served_seam, seams.contexts
    return (
        Seam(Scheduler, Scheduler.__init__, seams.serve_or_not,
             "ours serves the scheduler's model and configuration (vllm-mlx's own prefix caches off), or theirs stays on"),
        Seam(Scheduler, Scheduler._schedule_waiting, served(ServedScheduler.around_schedule_waiting),
             "plan the requests about to join the batch: restore, checkpoints, hold those waiting for a shared prefill"),
        Seam(Scheduler, Scheduler._create_batch_generator, served(ServedScheduler.around_create_batch_generator),
             "put the rows run by ServedScheduler and DraftedBatches (below) on the generator it builds"),
        Seam(Scheduler, Scheduler._process_batch_responses, served(ServedScheduler.around_process_batch_responses),
             "keep what each finished sequence holds (prompt and reply) with its checkpoints"),
        Seam(Scheduler, Scheduler._do_abort_request, served(ServedScheduler.around_abort_request),
             "a sequence that leaves early keeps nothing"),
        Seam(Scheduler, Scheduler._close_batch_generator, served(ServedScheduler.around_close_batch_generator),
             "nor do those of a generator closed"),
        Seam(Scheduler, Scheduler._recover_from_generation_error, seams.forget_recovered,
             "drop the contexts of the requests an error recovery aborts, served or not"),
        Seam(EngineCore, EngineCore.add_request, seams.carry_request_context,
             "the request's context (reuse record, chat head, admission) travels to the engine thread by request id"),
        Seam(BatchedEngine, BatchedEngine._apply_chat_template, seams.note_chat_head,
             "the chat head (system + tools), for models that checkpoint it", needs="vllm_mlx.engine.chat_template_safety"),
        Seam(BatchedEngine, BatchedEngine._compute_prefix_boundary, seams.skip_prefix_boundary_where_ours,
             "skipped where ours serves: it renders and tokenizes every prompt twice more for the shipped cache",
             needs="vllm_mlx.engine.chat_template_safety"),
        Seam(Scheduler, Scheduler.add_request, functools.partial(batched_admission.refuse_beyond_context, contexts),
             "a prompt the context cannot hold is refused before it is queued (admission)"),
        Seam(Scheduler, Scheduler._schedule_waiting, functools.partial(batched_admission.count_queue_waits, contexts),
             "each request's wait in the queue counted once it joined the batch (around the plan above)"),
        Seam(BatchGenerator, BatchGenerator._next, recurrent_padding_fix.unpadded_steps,
             "hybrid prompts in flight prefill together, never padded (every scheduler, vllm-mlx's own cache too)"),
        Seam(BatchGenerator, BatchGenerator.insert, ServedScheduler._insert,
             "each planned prefill stops at its checkpoints and at prefixes shared with waiting requests", run_by=ServedScheduler),
        Seam(BatchGenerator, BatchGenerator.next, ServedScheduler._next,
             "snapshot a prefill where it stopped, between two steps", run_by=ServedScheduler),
        Seam(BatchGenerator, BatchGenerator.insert, DraftedBatches._insert,
             "each row's draft session opens with its whole prompt (around the segmented insert above)", run_by=DraftedBatches),
        Seam(GenerationBatch, GenerationBatch.next, DraftedBatches._next,
             "a decode step verifies each row's draft where drafting pays", run_by=DraftedBatches),
    )


def install(planner: PrefixPlanner, drafting: Drafting | None = None) -> list[str]:
    """Every row of the table on vllm-mlx and mlx-lm: the batched engine serves our cache; what was patched."""
    return BatchedEngineSeams(planner, drafting).install()


class BatchedEngineSeams:
    """The wrappers the table's class rows put in, sharing one planner, one drafting and the requests' contexts."""

    def __init__(self, planner: PrefixPlanner, drafting: Drafting | None = None):
        self.planner = planner
        self.drafting = drafting
        # request id -> the context the request was submitted in (event loop side)
        self.contexts: dict[str, contextvars.Context] = {}
        self.served = ServedSchedulers()
        self.generator_rows: tuple[Seam, ...] = ()  # put on each generator a served scheduler builds
        self.patches: list[Patch] = []  # what install() replaced: `seam_table.take_out` puts it back

    def install(self) -> list[str]:
        try:
            table = seam_table(self)
        except (ImportError, AttributeError) as error:
            logger.warning("engine_patch: vllm-mlx's batched engine lacks a seam (%s); it runs as shipped", error)
            return []
        self.generator_rows = tuple(seam for seam in table if seam.run_by is not None)
        self.patches = put_in(table)
        return labels(self.patches)

    # --- the wrappers of the class rows: each given the method there now, returning its replacement -------------

    def served_seam(self, around: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """A Scheduler method as it was for a scheduler ours does not serve; else `around(served, method, *args)`, given
        the method bound to the scheduler and the call's arguments (`around` a ServedScheduler method)."""
        served_of = self.served.get

        def wrap(shipped: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(shipped)
            def seam(scheduler, *args):
                served = served_of(scheduler)
                if served is None:
                    return shipped(scheduler, *args)
                return around(served, functools.partial(shipped, scheduler), *args)

            return seam

        return wrap

    def serve_or_not(self, init: Callable[..., None]) -> Callable[..., None]:
        seams = self

        @functools.wraps(init)
        def __init__(scheduler, model, tokenizer, config=None):
            from vllm_mlx.scheduler import SchedulerConfig

            config = config or SchedulerConfig()
            reason = why_not_served(seams.planner, model, config)
            if reason is None:
                config = dataclasses.replace(config, enable_prefix_cache=False, ssd_cache_dir=None)
            init(scheduler, model, tokenizer, config)
            if reason is not None:
                logger.warning("engine_patch: the batched engine keeps vllm-mlx's own prefix cache: %s", reason)
                return
            seams.served[scheduler] = ServedScheduler(scheduler, seams.planner, seams.contexts, seams.drafting, seams.generator_rows)
            if seams.drafting is not None:
                seams.drafting.prepare(model)  # at start: auto measures its verify-cost curve
            logger.info("engine_patch: the batched engine's prefix cache is ours (vllm-mlx's own is off)")

        return __init__

    def forget_recovered(self, recover: Callable[[Any], list[str]]) -> Callable[[Any], list[str]]:
        contexts = self.contexts

        @functools.wraps(recover)
        def _recover_from_generation_error(scheduler):
            aborted = recover(scheduler)
            for request_id in aborted:  # dropped without an abort
                contexts.pop(request_id, None)
            return aborted

        return _recover_from_generation_error

    def carry_request_context(self, add_request: Callable[..., Any]) -> Callable[..., Any]:
        contexts = self.contexts

        @functools.wraps(add_request)
        async def add_request_in_context(engine, prompt, sampling_params=None, request_id=None, **kwargs):
            request_id = request_id or str(uuid.uuid4())
            contexts[request_id] = contextvars.copy_context()
            try:
                return await add_request(engine, prompt, sampling_params, request_id, **kwargs)
            except BaseException:
                contexts.pop(request_id, None)
                raise

        return add_request_in_context

    def note_chat_head(self, render: Callable[..., Any]) -> Callable[..., Any]:
        from vllm_mlx.engine.chat_template_safety import build_system_prompt_cache_prefix

        @functools.wraps(render)
        def render_and_note_head(engine, messages, tools=None, num_images=0, num_audios=0, chat_template_kwargs=None, enable_thinking=None):
            prompt = render(engine, messages, tools, num_images, num_audios, chat_template_kwargs, enable_thinking)
            template = EngineTemplate(lambda probe: render(engine, probe, tools, 0, 0, chat_template_kwargs, enable_thinking))
            set_head_text(lambda: build_system_prompt_cache_prefix(template, messages, template_kwargs={}))
            return prompt

        return render_and_note_head

    def skip_prefix_boundary_where_ours(self, boundary: Callable[..., Any]) -> Callable[..., Any]:
        seams = self

        @functools.wraps(boundary)
        def prefix_boundary_unless_ours(engine, *args, **kwargs):
            return 0 if seams._serves(engine) else boundary(engine, *args, **kwargs)

        return prefix_boundary_unless_ours

    def _serves(self, engine: Any) -> bool:
        scheduler = getattr(getattr(getattr(engine, "_engine", None), "engine", None), "scheduler", None)
        return scheduler is not None and scheduler in self.served


class EngineTemplate:
    """Renders probe messages the way the batched engine renders its prompts (its tools, kwargs, thinking),
    so vllm-mlx's own system-prefix probe finds the head of the prompt this engine really built."""

    def __init__(self, render):
        self.render = render

    def apply_chat_template(self, messages, **_):
        return self.render(messages)
