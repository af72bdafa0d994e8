"""A fan-out group for the replay: subagent instances started together.

Claude Code 2.1.x runs subagent instances concurrently in the background; the
replay sends the requests of a group that share a `Request.fan_out` id
concurrently, one thread per instance (`bench.replay`). Where the session
already has such a group, it is replayed as it is. Otherwise `with_fan_out`
appends one derived from the session's own Explore calls: `INSTANCES`
instances, each a copy of one call's turns whose task prompt starts with its
own words (so each instance shares the subagent's system prompt and tools, not
its conversation, with anything earlier) and whose billing block has its own
suffix, as a new subagent call's has.
"""

from __future__ import annotations

import copy

from stable_prefix.bench.replay import AGENT_ID_HEADER
from stable_prefix.bench.session import EXPLORE_LANE, Request, billing_block

FAN_OUT_ID = "fan-out-explore"
INSTANCES = 3


def subagent_calls(requests: list[Request], lane: str) -> list[list[Request]]:
    """The session's calls of subagent `lane`, each its requests in order (one call = one task prompt)."""
    calls: dict[str, list[Request]] = {}
    for request in requests:
        if request.lane == lane:
            calls.setdefault(_text(request.body["messages"][0]["content"]), []).append(request)
    return list(calls.values())


def _text(content: str | list[dict]) -> str:
    return content if isinstance(content, str) else "".join(block.get("text", "") for block in content)


def _with_task_prefix(body: dict, prefix: str, billing_suffix: str) -> dict:
    body = copy.deepcopy(body)
    body["system"][0] = billing_block(billing_suffix, subagent=True, cch=None)
    task = body["messages"][0]
    if isinstance(task["content"], str):
        task["content"] = prefix + task["content"]
    else:
        task["content"][0]["text"] = prefix + task["content"][0]["text"]
    return body


def fan_out_group(requests: list[Request], instances: int = INSTANCES, lane: str = EXPLORE_LANE) -> list[Request]:
    """`instances` concurrent instances of `lane` derived from its calls in `requests`,
    numbered after them; [] when `requests` has no call of `lane`."""
    calls = subagent_calls(requests, lane)
    if not calls:
        return []
    conversation = requests[-1].conversation
    turns = [calls[n % len(calls)] for n in range(instances)]
    group = []
    for step in range(max(len(call) for call in turns)):
        for instance, call in enumerate(turns):
            if step < len(call):
                body = _with_task_prefix(call[step].body, f"Part {instance + 1} of {instances}: ", f"f{instance:02x}")
                group.append(
                    Request(
                        index=len(requests) + len(group),
                        lane=lane,
                        conversation=conversation,
                        body=body,
                        headers={AGENT_ID_HEADER: f"fan-out-instance-{instance + 1}"},
                        fan_out=FAN_OUT_ID,
                    )
                )
    return group


def with_fan_out(requests: list[Request]) -> list[Request]:
    """`requests`, with a derived fan-out group at the end unless they already have one."""
    if any(request.fan_out for request in requests):
        return requests
    return [*requests, *fan_out_group(requests)]
