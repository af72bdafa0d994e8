"""The batched engine's decode with drafts: each row of mlx-lm's generation batch verifies its own draft.

mlx-lm's `GenerationBatch.next` runs one forward over every sequence in flight,
each feeding the token it drew last, and reports that token. Where drafting
pays (`Drafting.plan` over all rows: the width that maximises expected tokens
per unit of forward time), a drafted step replaces it: every row feeds its
next token and its own draft, right-padded to one width (rows that draft
nothing feed one token); every position is drawn with the batch's sampler,
each row keeps its confirmed prefix (`drafts/verification.py`), stops at a
stop sequence or its token limit inside it, and reports those tokens, several
per row and step (vllm-mlx's scheduler takes them in order, as it takes MTP's).
What a row fed beyond that leaves its attention layers row by row
(`cache_layers.drop_last_tokens_per_row`). Recurrent layers cannot be rewound
and mlx-lm 0.31 lets right padding into them (recurrent_padding_fix.py), so on
a model with recurrent layers every row feeds the full width (a short row
repeats its last token), and a row whose width was not all confirmed gets its
recurrent state back from before the step and feeds its confirmed tokens again
at the next step, in front of its new token: the row stays exact, and a row
that drafts nothing beside drafting ones catches up within a step or a few.

Rows with logits processors (penalties, constrained decoding) never draft
(counted in `draft_bypassed`); their logits are processed at their own
position. Where no row's acceptance could make a draft pay, the step is
mlx-lm's own, unchanged and pipelined; the sessions then only judge shadow
drafts with the tokens reported.

Seams: the generator's `insert` (each row's session opens with its whole
prompt: the planned request's tokens, not only the part left to prefill) and
its generation batch's `next` (one object per generator, extended and
filtered in place). A finished row's cache is extracted after its rollback:
a recurrent row that finished right after one holds fewer tokens than it
reported, which the prefix cache stores exactly (it keeps what the cache holds).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from stable_prefix.engine_patch.cache.cache_layers import (
    drop_last_tokens_per_row,
    has_recurrent_state,
    recurrent_state,
    restore_recurrent_state,
    why_not_draftable,
)
from stable_prefix.engine_patch.drafts.cost_gate import RowOutlook
from stable_prefix.engine_patch.drafts.draft_session import DraftSession
from stable_prefix.engine_patch.drafts.drafting import Drafting
from stable_prefix.engine_patch.drafts.verification import decided_run, decisive, greedy

from . import batch_generator_access

logger = logging.getLogger("engine_patch")


class DraftedBatches:
    """Drafting for one scheduler's generators: a session per sequence, the drafted step of its generation batch."""

    def __init__(self, drafting: Drafting, model: Any, tokenizer: Any = None, full_prompt: Callable[[Any], list[int]] = list):
        self.drafting = drafting
        self.model = model
        self.tokenizer = tokenizer
        self.full_prompt = full_prompt  # a row's whole prompt, from the prompt inserted (a planned one carries what it restored)
        self.generator: Any = None
        prompt_cache = make_prompt_cache(model)
        self.recurrent = has_recurrent_state(prompt_cache)
        self.why_not = why_not_draftable(prompt_cache)
        self.sessions: dict[int, DraftSession | None] = {}
        # Per row: tokens reported but not in the cache (a recurrent row put back), and tokens its
        # session was told before they were reported (the next token a drafted step drew).
        self.unfed: dict[int, list[int]] = {}
        self.told_ahead: dict[int, list[int]] = {}
        # Rows whose next token a drafted step nearly tied on (the margin rule): the next step is one token wide.
        self.decide_alone: set[int] = set()

    def attach(self, generator: Any) -> None:
        """Start over with `generator`, whose `insert` and generation batch's `next` run through `_insert` and `_next`
        (the rows of seams.py's table that DraftedBatches runs, put on it by `ServedScheduler.attach`)."""
        self.generator = generator
        self.sessions.clear()
        self.unfed.clear()
        self.told_ahead.clear()
        self.decide_alone.clear()

    def _insert(self, original_insert, prompts, max_tokens=None, caches=None, all_tokens=None, samplers=None,
                logits_processors=None, state_machines=None):
        uids = original_insert(prompts, max_tokens=max_tokens, caches=caches, all_tokens=all_tokens, samplers=samplers,
                               logits_processors=logits_processors, state_machines=state_machines)
        processors = logits_processors or [[]] * len(prompts)
        for uid, prompt, row_processors in zip(uids, prompts, processors):
            bypass = "logits processors" if row_processors else self.why_not
            self.sessions[uid] = self.drafting.session(self.full_prompt(prompt), bypass, self.tokenizer)
        self._forget_gone(self.generator)
        return uids

    def _forget_gone(self, generator: Any) -> None:
        live = batch_generator_access.live_uids(generator)
        for table in (self.sessions, self.unfed, self.told_ahead):
            for uid in [uid for uid in table if uid not in live]:
                del table[uid]
        self.decide_alone &= set(live)

    # --- a step ----------------------------------------------------------------------

    def _next(self, original_next):
        generator, batch = self.generator, self.generator._generation_batch
        if not batch.uids:
            return []
        sessions = [self.sessions.get(uid) for uid in batch.uids]
        catching_up = any(self.unfed.get(uid) for uid in batch.uids)
        alone, self.decide_alone = bool(self.decide_alone), set()
        if not catching_up and alone:  # a near tie is decided by a one-token forward, as without drafts
            return self._plain(batch, original_next, sessions)
        if not catching_up and not any(s is not None and s.may_draft and self.drafting.might_pay(s.acceptance.rate) for s in sessions):
            return self._plain(batch, original_next, sessions)
        next_tokens = batch._next_tokens.tolist()
        outlooks = []
        for index, (uid, session) in enumerate(zip(batch.uids, sessions)):
            if not self.told_ahead.get(uid):  # a drafted step told its session the token it drew next
                self._tell(uid, session, [next_tokens[index]])
            head = len(self.unfed.get(uid, ())) + 1
            remaining = batch.max_tokens[index] - batch._num_tokens[index]
            outlooks.append(session.outlook(remaining, head) if session is not None else _no_draft(head))
        plan = self.drafting.plan(outlooks)
        if plan.width == 1:
            return self._plain(batch, original_next, sessions)
        drafts = [session.draft(count) if session is not None and count else [] for session, count in zip(sessions, plan.drafts)]
        return self._drafted(generator, batch, next_tokens, drafts)

    def _plain(self, batch, original_next, sessions):
        """mlx-lm's own step; each row's session judges its shadow draft with the token reported."""
        rows = len(batch.uids)
        responses = original_next()
        self.drafting.stats.step(rows)
        self.drafting.stats.emitted(len(responses))
        for response in responses:
            self._reported(response.uid, self.sessions.get(response.uid), response.token)
            if response.finish_reason is not None:
                self._forget(response.uid)
        return responses

    def _tell(self, uid: int, session: DraftSession | None, tokens: list[int], drafted: bool = False) -> None:
        """The session learns tokens before they are reported (they must not be told twice)."""
        if session is not None:
            session.decided(tokens, drafted=drafted)
        self.told_ahead.setdefault(uid, []).extend(tokens)

    def _reported(self, uid: int, session: DraftSession | None, token: int) -> None:
        ahead = self.told_ahead.get(uid)
        if ahead and ahead[0] == token:
            ahead.pop(0)
        elif session is not None:
            session.decided([token])

    def _forget(self, uid: int) -> None:
        for table in (self.sessions, self.unfed, self.told_ahead):
            table.pop(uid, None)
        self.decide_alone.discard(uid)

    def _drafted(self, generator, batch, next_tokens: list[int], drafts: list[list[int]]):
        rows = list(batch.uids)
        heads = [[*self.unfed.get(uid, []), next_tokens[index]] for index, uid in enumerate(rows)]
        width = max(len(head) + len(draft) for head, draft in zip(heads, drafts))
        # Right padding (the row's last token again): never accepted, rolled back with the rejected tokens.
        fed = [head + draft + [(head + draft)[-1]] * (width - len(head) - len(draft)) for head, draft in zip(heads, drafts)]
        saved = recurrent_state(batch.prompt_cache) if self.recurrent else None
        logits = batch.model(mx.array(fed), cache=batch.prompt_cache)
        # Each row's distributions from its next token on: its draft's positions and the one after.
        row_logits = [self._processed(batch, index, logits[index, len(head) - 1 : len(head) + len(draft)], head)
                      for index, (head, draft) in enumerate(zip(heads, drafts))]
        logprobs = [rows_logits - mx.logsumexp(rows_logits, axis=-1, keepdims=True) for rows_logits in row_logits]
        drawn = self._drawn(batch, logprobs)
        sure = [decisive(row) if greedy(self._sampler(batch, index)) else None for index, row in enumerate(logprobs)]
        mx.eval(drawn, logprobs, *[row for row in sure if row is not None])
        drawn_tokens = [values.tolist() for values in drawn]

        responses, keep, dropped, put_back, next_drawn, next_logprobs = [], [], [], [], [], []
        previous_logprobs = batch._next_logprobs
        for index, uid in enumerate(rows):
            session = self.sessions.get(uid)
            head, draft, row_drawn = heads[index], drafts[index], drawn_tokens[index]
            confirmed, next_decided = self._decided(uid, head, draft, row_drawn, sure[index])
            reported = [next_tokens[index], *draft[:confirmed]]
            distributions = [previous_logprobs[index], *(logprobs[index][position] for position in range(confirmed))]
            if draft:
                session.judged(len(draft), confirmed)
            if not next_decided:
                # The margin rule: the last decided token is fed again, alone, at the next step (reported then).
                pending, pending_logprobs = reported.pop(), distributions.pop()
            finish, reported, states, matches = self._finish_within(batch, index, reported)
            kept = len(head) - 1 + len(reported)
            if self.recurrent and kept < width:
                put_back.append(index)
                dropped.append(width)
                self.unfed[uid] = head[: len(head) - 1] + reported
            else:
                dropped.append(width - kept)
                self.unfed.pop(uid, None)
            if finish is None and next_decided:
                bonus = row_drawn[confirmed]
                self._tell(uid, session, draft[:confirmed] + [bonus], drafted=bool(draft))
                next_drawn.append(bonus)
                next_logprobs.append(logprobs[index][confirmed])
            elif finish is None:
                if confirmed:
                    self._tell(uid, session, draft[:confirmed], drafted=True)
                next_drawn.append(pending)
                next_logprobs.append(pending_logprobs)
            else:
                next_drawn.append(next_tokens[index])  # the row leaves the batch below
                next_logprobs.append(previous_logprobs[index])
            if finish is None:
                for token in reported:
                    self._reported(uid, session, token)
            responses.append((index, uid, reported, distributions[: len(reported)], states, matches, finish))
            if finish is None:
                keep.append(index)
        if put_back:
            restore_recurrent_state(batch.prompt_cache, saved, rows=put_back)
        drop_last_tokens_per_row(batch.prompt_cache, dropped)
        self.drafting.stats.step(len(rows), drafted=sum(1 for draft in drafts if draft))

        out = []
        for index, uid, reported, distributions, states, matches, finish in responses:
            self.drafting.stats.emitted(len(reported))
            batch.tokens[index].extend(reported)
            for position, (token, distribution) in enumerate(zip(reported, distributions)):
                last = position == len(reported) - 1
                out.append(batch.Response(
                    uid=uid, token=token, logprobs=distribution, finish_reason=finish if last else None,
                    current_state=states[position], match_sequence=matches[position],
                    prompt_cache=batch.extract_cache(index) if last and finish is not None else None,
                    all_tokens=batch.tokens[index] if last and finish is not None else None,
                ))
            if finish is not None:
                self._forget(uid)
        batch._next_tokens = mx.array(next_drawn)
        batch._next_logprobs = next_logprobs
        if len(keep) < len(rows):
            batch.filter(keep)
        return out

    def _decided(self, uid: int, head: list[int], draft: list[int], drawn: list[int], sure) -> tuple[int, bool]:
        """The row's kept draft tokens and whether its next token is decided here (`verification.decided_run`).

        A near tie ends the run and the row's last decided token waits for a one-token step. A row of a
        model with recurrent layers that would then have tokens to feed again cannot get one (its catch-up
        is a wider forward): there the wider forward decides, counted in `draft_near_ties_taken_wide`.
        """
        confirmed, next_decided = decided_run(draft, drawn, sure.tolist() if sure is not None else None)
        if next_decided:
            return confirmed, True
        if self.recurrent and (len(head) > 1 or confirmed > 0):
            self.drafting.stats.near_tie_taken_wide()
            return decided_run(draft, drawn)
        self.drafting.stats.decided_alone()
        self.decide_alone.add(uid)
        return confirmed, False

    @staticmethod
    def _sampler(batch, index: int):
        return (batch.samplers[index] if any(batch.samplers or []) else None) or batch.fallback_sampler

    def _processed(self, batch, index: int, logits: mx.array, head: list[int]) -> mx.array:
        """A row's logits through its logits processors, at its next token's position (such a row never drafts)."""
        processors = batch.logits_processors[index] if batch.logits_processors else None
        if not processors:
            return logits
        context = batch._token_context[index].update_and_fetch(mx.array(head[-1:]))
        processed = logits[:1]
        for processor in processors:
            processed = processor(context, processed)
        return processed

    def _drawn(self, batch, logprobs: list[mx.array]) -> list[mx.array]:
        """Every position of every row drawn with that row's sampler (the batch's own by default)."""
        samplers = batch.samplers if any(batch.samplers or []) else None
        if samplers is None:
            lengths = [len(rows) for rows in logprobs]
            flat = batch.fallback_sampler(mx.concatenate(logprobs, axis=0))
            bounds = [sum(lengths[:index]) for index in range(len(lengths) + 1)]
            return [flat[start:end] for start, end in zip(bounds, bounds[1:])]
        return [(sampler or batch.fallback_sampler)(rows) for sampler, rows in zip(samplers, logprobs)]

    def _finish_within(self, batch, index: int, reported: list[int]) -> tuple[str | None, list[int], list[Any], list[Any]]:
        """Report tokens until the row's token limit or a stop sequence ends it (the rest are not reported);
        the matcher's state and match after each, as mlx-lm's `next` reports them."""
        states, matches = [], []
        finish = None
        for position, token in enumerate(reported):
            batch._num_tokens[index] += 1
            batch._matcher_states[index], match, state = batch.state_machines[index].match(batch._matcher_states[index], token)
            states.append(state)
            matches.append(match)
            if batch._num_tokens[index] >= batch.max_tokens[index]:
                finish = "length"
            if match is not None and state is None:
                finish = "stop"
            if finish is not None:
                reported = reported[: position + 1]
                break
        return finish, reported, states, matches


def _no_draft(head: int) -> RowOutlook:
    return RowOutlook(0.0, 0, head)
