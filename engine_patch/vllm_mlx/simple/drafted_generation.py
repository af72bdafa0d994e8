"""SimpleEngine's decode with drafts: mlx-lm's `generate_step`, verifying the session's drafts as it goes.

Two seams. `DraftedGeneration` is a layer of `mlx_lm.stream_generate` (outside
the cached one, so it sees the whole prompt): it opens the request's draft
session and hands it down as a keyword. `mlx_lm.generate.generate_step`, which
`stream_generate` calls, is replaced by a dispatcher: a call carrying that
keyword decodes here, any other call runs mlx-lm's own.

The decode loop is mlx-lm's: prefill in chunks, then steps whose next forward
is dispatched before the token it feeds is read, so the CPU's bookkeeping
overlaps the model's work. When the session's acceptance makes a draft pay
(`Drafting.plan`), a step feeds the decided token and the draft in one
forward instead, draws every position with the request's sampler, keeps the
confirmed part (`drafts/verification.py`) and rolls the rest out of the cache
(`cache_layers.drop_last_tokens`; recurrent layers put back as they were,
their accepted tokens fed again at the next step). Requests with logits
processors, a quantized or bounded cache or input embeddings decode as mlx-lm
does (counted in `draft_bypassed`); every decode forward is counted.

What the cache holds is what `generate_step` leaves: the prompt and every
token yielded (fed before it is yielded), so the prefix cache stores the same
state. A consumer that stops in the middle of a step's accepted tokens (a stop
sequence) gets the extra ones rolled out when it closes the generator; after a
rollback of recurrent layers the cache may hold fewer tokens than were
yielded, which the prefix cache's `store` keeps exactly (it stores what the
cache holds).
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable, Iterator
from typing import Any

import mlx.core as mx
from mlx_lm.generate import generation_stream
from mlx_lm.models.cache import make_prompt_cache

from stable_prefix.engine_patch.cache.cache_layers import drop_last_tokens, has_recurrent_state, recurrent_state, restore_recurrent_state, why_not_draftable
from stable_prefix.engine_patch.drafts.draft_session import DraftSession
from stable_prefix.engine_patch.drafts.drafting import Drafting
from stable_prefix.engine_patch.drafts.verification import argmax_sampler, decided_run, decisive, greedy

logger = logging.getLogger("engine_patch")

# generate_step keywords that change what the loop must do: left to mlx-lm's own.
MLX_LM_ONLY = ("logits_processors", "kv_bits", "max_kv_size", "input_embeddings")
CLEAR_CACHE_EVERY = 256


class DraftedGeneration:
    """A `stream_generate` layer that gives each request its draft session (and counts its decode)."""

    def __init__(self, generate: Callable[..., Iterator[Any]], drafting: Drafting):
        functools.update_wrapper(self, generate, updated=())  # `__wrapped__`: what it runs around
        self.generate = generate
        self.drafting = drafting

    def __call__(self, model, tokenizer, prompt, max_tokens: int = 256, draft_model=None, **kwargs):
        if draft_model is not None:  # mlx-lm's own speculative decoding: nothing of ours below it
            self.drafting.stats.bypass("draft model")
            yield from self.generate(model, tokenizer, prompt, max_tokens, draft_model=draft_model, **kwargs)
            return
        self.drafting.prepare(model)
        bypass = next((f"{option.replace('_', ' ')}" for option in MLX_LM_ONLY if kwargs.get(option)), None)
        tokens = prompt if isinstance(prompt, list) else None
        session = self.drafting.session(tokens, bypass, tokenizer) if tokens is not None else None
        kwargs["draft_request"] = DraftRequest(self.drafting, session)
        yield from self.generate(model, tokenizer, prompt, max_tokens, **kwargs)


class DraftRequest:
    """What `generate_step` gets for one request: the server's drafting and the request's session (or None)."""

    def __init__(self, drafting: Drafting, session: DraftSession | None):
        self.drafting = drafting
        self.session = session

    def decode(self, original: Callable[..., Iterator[Any]], prompt: mx.array, model: Any, **kwargs) -> Iterator[Any]:
        if self.session is None or not self.session.may_draft or any(kwargs.get(option) for option in MLX_LM_ONLY):
            return self._counted(original(prompt, model, **kwargs))
        if kwargs.get("prompt_cache") is None:
            kwargs["prompt_cache"] = make_prompt_cache(model)
        reason = why_not_draftable(kwargs["prompt_cache"])
        if reason:
            self.drafting.stats.bypass(reason)
            return self._counted(original(prompt, model, **kwargs))
        return DraftedDecode(model, self.drafting, self.session, **kwargs).run(prompt)

    def _counted(self, tokens: Iterator[Any]) -> Iterator[Any]:
        """mlx-lm's own loop: each token it yields was fed by one forward."""
        stats, session = self.drafting.stats, self.session
        for token, logprobs in tokens:
            stats.step()
            stats.emitted()
            if session is not None:
                session.decided([int(token)])
            yield token, logprobs


class DraftedDecode:
    """One request's decode loop: mlx-lm's steps, or verify steps where a draft pays.

    `generated` holds every token decided so far (its last one is the next to
    yield), `in_cache` how many of them the cache holds, `yielded` how many
    went out. A verify step feeds `generated[in_cache:]` and its draft.
    """

    def __init__(self, model: Any, drafting: Drafting, session: DraftSession, *, prompt_cache: list[Any], max_tokens: int = 256,
                 sampler=None, prefill_step_size: int = 2048, prompt_progress_callback=None, **_ignored):
        self.model = model
        self.drafting = drafting
        self.stats = drafting.stats
        self.session = session
        self.max_tokens = max_tokens
        self.sampler = sampler or argmax_sampler
        self.greedy = greedy(self.sampler)  # its near ties are decided by one-token forwards (the margin rule)
        self.cache = prompt_cache
        self.recurrent = has_recurrent_state(self.cache)
        self.prefill_step_size = prefill_step_size
        self.progress = prompt_progress_callback or (lambda *_: None)
        self.generated: list[int] = []
        self.in_cache = 0
        self.yielded = 0
        # The last verify step, to undo it if the consumer stops before all it fed went out:
        # (tokens in the cache before it, the recurrent state then).
        self._last_step: tuple[int, list[Any] | None] | None = None

    def run(self, prompt: mx.array) -> Iterator[tuple[int, mx.array]]:
        try:
            yield from self._decode(prompt)
        finally:
            self._settle()

    # --- mlx-lm's loop -------------------------------------------------------------

    def _decode(self, prompt: mx.array) -> Iterator[tuple[int, mx.array]]:
        with mx.stream(generation_stream):
            token, logprobs = self._prefill(prompt)
        mx.async_eval(token, logprobs)
        drafting_next = False
        while self.yielded < self.max_tokens:
            if len(self.generated) == self.yielded:  # `token` not read yet (a verify step reads its next token itself)
                self.generated.append(token.item())
                self.session.decided(self.generated[-1:])
            if not drafting_next:
                # mlx-lm's step: the forward feeding `token` is dispatched before the token is handed out.
                with mx.stream(generation_stream):
                    next_token, next_logprobs = self._plain_step(token)
                mx.async_eval(next_token, next_logprobs)
                self.in_cache += 1
                if self.yielded == 0:
                    self.progress(prompt.size, prompt.size)
                self.stats.step()
                yield from self._emit([logprobs])
                token, logprobs = next_token, next_logprobs
                drafting_next = self._draft_pays()
                continue
            with mx.stream(generation_stream):
                emitted_logprobs, token, logprobs = self._verify_step(logprobs)
            yield from self._emit(emitted_logprobs)
            # Tokens a rollback left out of the cache are fed by the next verify step, whatever the plan.
            drafting_next = self.in_cache < len(self.generated) - 1 or self._draft_pays()

    def _prefill(self, prompt: mx.array) -> tuple[mx.array, mx.array]:
        """generate_step's prefill: chunks up to the last prompt token, whose logits give the first token."""
        total = prompt.size
        self.progress(0, total)
        done = 0
        while total - done > 1:
            chunk = min(self.prefill_step_size, total - done - 1)
            self.model(prompt[done : done + chunk][None], cache=self.cache)
            mx.eval([layer.state for layer in self.cache])
            done += chunk
            self.progress(done, total)
            mx.clear_cache()
        return self._plain_step(prompt[done:])

    def _plain_step(self, tokens: mx.array) -> tuple[mx.array, mx.array]:
        logits = self.model(tokens[None], cache=self.cache)[:, -1, :]
        logprobs = logits - mx.logsumexp(logits, keepdims=True)
        return self.sampler(logprobs), logprobs.squeeze(0)

    def _emit(self, logprobs: list[mx.array]) -> Iterator[tuple[int, mx.array]]:
        """Hand out the next decided tokens, one per distribution given (each drawn from its own)."""
        for distribution in logprobs:
            if self.yielded >= self.max_tokens:
                return
            value = self.generated[self.yielded]
            self.yielded += 1
            self.stats.emitted()
            if self.yielded % CLEAR_CACHE_EVERY == 0:
                mx.clear_cache()
            yield value, distribution

    # --- drafted steps ---------------------------------------------------------------

    def _draft_pays(self) -> bool:
        """Whether the session's acceptance makes a draft pay at the next step (checked before any lookup)."""
        remaining = self.max_tokens - self.yielded
        if remaining <= 1 or not self.drafting.might_pay(self.session.acceptance.rate):
            return False
        return self.drafting.plan([self.session.outlook(remaining)]).width > 1

    def _verify_step(self, logprobs: mx.array) -> tuple[list[mx.array], mx.array, mx.array]:
        """Feed the tokens the cache lacks and a draft; the distributions of the tokens to hand out, and the next token.

        `logprobs` is the distribution the last decided token was drawn from.
        """
        head = self.generated[self.in_cache :]
        remaining = self.max_tokens - self.yielded
        plan = self.drafting.plan([self.session.outlook(remaining, head=len(head))])
        draft = self.session.draft(plan.drafts[0]) if plan.width > len(head) else []
        fed = head + draft
        # Recurrent layers are saved (references) so a draft cut short, or a consumer stopping early, can put them back.
        saved = recurrent_state(self.cache) if self.recurrent else None
        logits = self.model(mx.array(fed)[None], cache=self.cache)[0, len(head) - 1 :, :]
        all_logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        drawn = self.sampler(all_logprobs)
        sure = decisive(all_logprobs) if self.greedy and len(fed) > 1 else None  # a one-token forward decides as it is
        mx.eval(drawn, all_logprobs, *([sure] if sure is not None else []))
        drawn_tokens = [int(token) for token in drawn.tolist()]
        accepted, next_decided = decided_run(draft, drawn_tokens, sure.tolist() if sure is not None else None)
        self.stats.step(drafted=1 if draft else 0)
        if draft:
            self.session.judged(len(draft), accepted)
        if next_decided:
            next_token, next_logprobs = drawn[accepted : accepted + 1], all_logprobs[accepted]
        else:
            next_token, next_logprobs = self._decided_alone(fed, len(head) + accepted, saved)
        decided = draft[:accepted] + [int(next_token.item())]
        self.session.decided(decided, drafted=bool(draft))
        self.generated += decided
        rejected = len(draft) - accepted
        if next_decided and rejected and self.recurrent:
            # Recurrent state cannot be rewound: back to before this step, its confirmed tokens fed again next time.
            restore_recurrent_state(self.cache, saved)
            drop_last_tokens(self.cache, len(fed))
            self._last_step = None
        else:
            if next_decided:
                drop_last_tokens(self.cache, rejected)
            self._last_step = (self.in_cache, saved)
            self.in_cache += len(head) + accepted
        # Handed out now: the last token decided before (drawn from `logprobs`) and the confirmed draft.
        emitted = [logprobs] + [all_logprobs[index] for index in range(accepted)]
        return emitted, next_token, next_logprobs

    def _decided_alone(self, fed: list[int], kept: int, saved: list[Any] | None) -> tuple[mx.array, mx.array]:
        """The margin rule's fallback: the token after `fed[:kept]` decided by a one-token forward feeding `fed[kept - 1]`.

        The cache is left holding `fed[:kept]`: the verify's forward is cut back to before that token
        (recurrent layers: put back and the tokens before it fed again, without a decision).
        """
        if saved is not None:
            restore_recurrent_state(self.cache, saved)
            drop_last_tokens(self.cache, len(fed))
            if kept > 1:
                self.model(mx.array(fed[: kept - 1])[None], cache=self.cache)
                self.stats.step()
        else:
            drop_last_tokens(self.cache, len(fed) - kept + 1)
        self.stats.step()
        self.stats.decided_alone()
        next_token, next_logprobs = self._plain_step(mx.array(fed[kept - 1 : kept]))
        mx.eval(next_token, next_logprobs)
        return next_token, next_logprobs

    def _settle(self) -> None:
        """Leave the cache holding exactly the prompt and the tokens handed out (the prefix cache stores it)."""
        try:
            if self.in_cache > self.yielded and self._last_step is not None:
                # The consumer stopped inside the last step's confirmed tokens.
                before, saved = self._last_step
                if saved is not None:
                    restore_recurrent_state(self.cache, saved)
                    drop_last_tokens(self.cache, self.in_cache - before)
                    self.in_cache = before
                else:
                    drop_last_tokens(self.cache, self.in_cache - self.yielded)
                    self.in_cache = self.yielded
            if self.in_cache < self.yielded:
                # Handed out but not in the cache (a recurrent rollback): fed once, so the cache is what was said.
                with mx.stream(generation_stream):
                    self.model(mx.array(self.generated[self.in_cache : self.yielded])[None], cache=self.cache)
                    mx.eval([layer.state for layer in self.cache])
                self.in_cache = self.yielded
        except Exception as error:  # the prefix cache then keeps what its own rules allow
            logger.warning("engine_patch: settling the cache after a drafted decode failed (%r)", error)


def drafts_dispatched(original: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    """mlx-lm's `generate_step` routing a call that carries a draft request through `DraftRequest.decode` (a row of
    `seams.py`'s table); `original` itself where it does already."""
    if getattr(original, "drafts_verified", False):
        return original

    @functools.wraps(original)
    def generate_step(prompt, model, *, draft_request: DraftRequest | None = None, **kwargs):
        if draft_request is None:
            return original(prompt, model, **kwargs)
        return draft_request.decode(original, prompt, model, **kwargs)

    generate_step.drafts_verified = True
    return generate_step


def install(drafting: Drafting) -> None:
    """The dispatcher alone, for what decodes with drafts without vllm-mlx (tests); the simple engine's `install()`
    puts it in with its other seams."""
    generate_module = sys.modules["mlx_lm.generate"]  # `mlx_lm.generate` is also a function's name
    generate_module.generate_step = drafts_dispatched(generate_module.generate_step)
