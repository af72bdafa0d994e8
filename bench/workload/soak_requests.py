"""The requests a soak or load run sends: the bench session's lanes, session after session, made comparable.

Each session (`session.generate_session`, one seed per session) rotates
through a day's lanes: the main agent, subagent instances (a fan-out group
among them), title requests, a `/clear`, a `/compact`, new conversations. A run
takes them in order, seed after seed, as long as it needs. Each body is made
greedy (temperature 0) and short (`max_tokens`), as a replay does, and tagged
with `metadata.user_id` = its run-wide id, which the proxy passes on, so its
forwarded body can be found in the captures and its answer compared.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field

from stable_prefix.bench.workload.session import generate_session

MAX_TOKENS = 16


@dataclass(frozen=True)
class SoakRequest:
    user_id: str
    lane: str
    body: dict = field(repr=False)
    headers: dict[str, str] = field(default_factory=dict)


def comparable(body: dict, user_id: str, max_tokens: int = MAX_TOKENS) -> dict:
    prepared = copy.deepcopy(body)
    prepared.update(temperature=0, max_tokens=max_tokens, stream=True, metadata={"user_id": user_id})
    return prepared


def session_requests(scale: float, first_seed: int = 0, prefix: str = "soak") -> Iterator[SoakRequest]:
    """Endless: session after session (seeds `first_seed`, `first_seed + 1`, ...), each request once."""
    number = itertools.count()
    for seed in itertools.count(first_seed):
        for request in generate_session(seed=seed, scale=scale):
            user_id = f"{prefix}-{next(number):05d}"
            yield SoakRequest(user_id, request.lane, comparable(request.body, user_id), dict(request.headers))


def request_pool(scales: tuple[float, ...], seeds: range) -> list[SoakRequest]:
    """Every request of a few sessions at a few sizes: what load clients draw from (ids are set per send)."""
    return [SoakRequest("", request.lane, request.body, dict(request.headers))
            for scale in scales for seed in seeds for request in generate_session(seed=seed, scale=scale)]
