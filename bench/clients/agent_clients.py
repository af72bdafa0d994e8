"""How each agent's client behaves when the stream it reads is cut: the team bench's users behave so.

Measured with each real CLI (`bench/probes/agent_cuts.py` -> `MEASURED_IN`, the proxy's own recovery off):
whether it sends the request again, streamed or not, after the stream ended with the protocol's error
event (the proxy's default) and after a silent cut. The facts are each agent's record's `resends`
(`stable_prefix/agents/roster.py`), which the proxy's stream recovery reads too;
`tests/bench/clients/test_agent_clients.py` checks them against the committed measurement, so they change with it.
Every agent sends no request again on an error status (none measured: the routers retry a request refused
before any answer, `stable_prefix/routers.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from stable_prefix.agents.base import NOT_STREAMED, STREAMED  # noqa: F401 (the records' words are the bench's)
from stable_prefix.agents.roster import AGENTS

MEASURED_IN = "bench/results/agent-cuts/latest.json"
# It sends the partial answer back with a request to go on (Qwen Code after a silent cut mid-reply; before any
# output it sends the request again): a bench client sends the request again, streamed, in its place (what the
# turn costs is alike: one more streamed request, warm).
RESUMED = "resumed"
# How a client's reply says its connection ended mid-stream with no error event (`bench.replay.post_streamed`).
SILENT_CUT = "stream cut: "


@dataclass(frozen=True)
class AgentClient:
    key: str  # as bench/clients/cli_agents.py names the CLI
    name: str
    protocol: str  # anthropic, openai (chat completions), responses
    after_error_event: str | None  # how it sends the request again: STREAMED (RESUMED counts as it), NOT_STREAMED, or None (it does not)
    after_silent_cut: str | None


# Every agent whose behaviour after a cut was measured.
CLIENTS = {agent.key: AgentClient(agent.key, agent.name, agent.protocol, agent.resends.after_error_event, agent.resends.after_silent_cut)
           for agent in AGENTS if agent.resends is not None}


class Answered(Protocol):
    status: int
    error: str | None
    stop_reason: str | None


def loss_kind(reply: Answered) -> str | None:
    """How a reply fell short, as its client sees it: `refused` (no 200: the connection failed, or an error
    status), `error event` (the stream ended with the protocol's error event), `cut` (it ended without its
    reply's end and without an error event: cut silently); None when it was answered whole."""
    if reply.status != 200:
        return "refused"
    if reply.error is not None:
        return "cut" if reply.error.startswith(SILENT_CUT) else "error event"
    return "cut" if reply.stop_reason is None else None


def resend_as(client: AgentClient, reply: Answered) -> str | None:
    """How `client` sends the request of this reply again (STREAMED, NOT_STREAMED), or None: it does not."""
    kind = loss_kind(reply)
    if kind == "error event":
        return client.after_error_event
    if kind == "cut":
        return client.after_silent_cut
    return None
