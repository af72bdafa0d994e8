"""A scripted capture session for the session page's tests, written by the real addons in process
(`bench/clients/capture_in_process.py`): `tests/fixtures/claude_code.py`'s bodies growing a turn at a time,
the git status in the main agent's system text changed at a chosen request (a known break), each answered
with the usage and time to first token a prefix cache would give.
"""

from __future__ import annotations

from pathlib import Path

from stable_prefix.bench.clients.capture_in_process import Exchange, write_session
from tests.fixtures import claude_code

# The scripted break: the git status in the main agent's system text changes (a file appears).
GIT_STATUS, CHANGED_GIT_STATUS = "M src/app.py", "M src/app.py\n?? notes.txt"


def scripted_session(directory: Path, *, main_turns: int = 8, break_at: int = 5, subagent_turns: int = 3) -> Path:
    """A main lane of `main_turns` requests whose system text changes at its request `break_at`, and a
    subagent lane; usage as a prefix cache reports it (a kept prefix reuses all but the new turn, the break
    and each lane's first request reuse nothing), TTFT growing with what was prefilled."""
    exchanges = []
    for turn in range(1, main_turns + 1):
        git_status = CHANGED_GIT_STATUS if turn >= break_at else GIT_STATUS
        exchanges.append(answered(claude_code.main_request(turn, git_status=git_status), prompt=400 + 150 * turn, new=150, cold=turn in (1, break_at)))
        if turn <= subagent_turns:
            exchanges.append(answered(claude_code.subagent_request("explore", turn), prompt=300 + 120 * turn, new=120, cold=turn == 1))
    return write_session(directory, exchanges)


def answered(body: dict, *, prompt: int, new: int, cold: bool) -> Exchange:
    """`body` answered with `prompt` tokens, all prefilled when `cold`, else all but the `new` ones reused; TTFT
    50 ms and 0.5 ms per token prefilled."""
    reused = 0 if cold else prompt - new
    return Exchange(body, {"input_tokens": prompt - reused, "cache_read_input_tokens": reused, "output_tokens": 2}, 0.05 + (prompt - reused) / 2000)
