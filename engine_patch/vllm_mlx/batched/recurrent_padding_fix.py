"""mlx-lm 0.31's padded prefill of recurrent layers, carried fix: no prefill step is ever padded.

`BatchGenerator` prefills the sequences of its prompt batch together, each
step up to `prefill_step_size` tokens of each one's current segment; when
those differ in length it right-pads the shorter ones and tells each layer
their lengths. Attention layers honour that; mlx-lm 0.31's recurrent ones do
not: gated DeltaNet (Qwen3.5/3.6, Qwen3-Next) masks only the left padding
once `ArraysCache.left_padding` is set, which it is for every batch of fresh
prompts (`ArraysCache.make_mask`), and Mamba2 (Nemotron-H) never passes the
lengths to `ssm_update`; both take their conv state from the padded end. So a
hybrid prompt prefilled beside a longer one is answered, and would be cached,
from a state fed with padding (on the tiny Qwen3.5-shaped model the
recurrent state off by up to 6.2, another greedy answer from the first
token). mlx-lm 0.32.2 fixes the gated-DeltaNet side (PR #1736), not Mamba2,
and vllm-mlx 0.6.0 pins mlx-lm < 0.32.

The fix avoids the padding instead of masking it, the same way for every
recurrent layer: before each step, the segment every sequence of the step
will prefill is cut to the shortest one's chunk, so all prompts of a step
have one length and none is padded. A longer prompt takes the rest at the
next steps, beside the others' next chunks; a step costs a little more only
where one prompt's segment ends inside another's chunk. Decoding is
untouched. Prefills stay batched (before: one prompt at a time, so three
fan-out instances prefilled one after another).

On an mlx-lm whose generator lacks the fields this reads
(`batch_generator_access.why_unsupported`), a model with recurrent layers
prefills one prompt at a time, as before. `tests/engine_patch/vllm_mlx/test_recurrent_padding_fix.py`
fails the day mlx-lm no longer feeds the padding into the recurrent state of
any hybrid family, so this module can go.
"""

from __future__ import annotations

import functools
import logging
import weakref
from typing import Any

from mlx_lm.generate import BatchGenerator
from mlx_lm.models.cache import make_prompt_cache

from stable_prefix.engine_patch.cache.cache_layers import has_recurrent_state

from . import batch_generator_access

logger = logging.getLogger("engine_patch")

_recurrent: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def cut_to_one_length(segment_lists: list[list[list[int]]], step_size: int) -> None:
    """Cut each list's first segment (in place) so that all of them prefill the same number of tokens next."""
    chunks = {min(len(segments[0]), step_size) for segments in segment_lists if segments and segments[0]}
    if len(chunks) < 2:
        return  # one length already: nothing would be padded
    length = min(chunks)
    for segments in segment_lists:
        if segments and len(segments[0]) > length:
            segments[0:1] = [segments[0][:length], segments[0][length:]]


def _has_recurrent_layers(generator: Any) -> bool:
    if generator not in _recurrent:
        _recurrent[generator] = has_recurrent_state(make_prompt_cache(generator.model))
    return _recurrent[generator]


def unpadded_steps(next_step: Any) -> Any:
    """`BatchGenerator._next` (mlx-lm's step) made to prefill unpadded for models with recurrent layers: a row of the
    batched engine's seam table (`seams.py`); `next_step` itself where it is already this fix."""
    if getattr(next_step, "unpadded_for_recurrent_layers", False):
        return next_step

    @functools.wraps(next_step)
    def _next(generator):
        if _has_recurrent_layers(generator):
            if batch_generator_access.why_unsupported(generator) is None:
                cut_to_one_length(batch_generator_access.segments_of_next_prefill(generator), generator.prefill_step_size)
            else:
                generator.prefill_batch_size = 1  # no way to cut the segments here: one prompt per prefill, never padded
        return next_step(generator)

    _next.unpadded_for_recurrent_layers = True
    logger.info("engine_patch: mlx-lm's BatchGenerator prefills hybrid prompts together, unpadded (recurrent padding fix)")
    return _next


def install() -> list[str]:
    """The fix alone, for what runs mlx-lm's generator without vllm-mlx (probes, checks); the batched engine's
    `install()` puts it in with its other seams."""
    fixed = unpadded_steps(BatchGenerator._next)
    if fixed is BatchGenerator._next:
        return []
    BatchGenerator._next = fixed
    return ["mlx-lm BatchGenerator recurrent padding fix (equal prefill chunks)"]
