"""One long conversation: a main agent working for 100+ turns until its prompt fills the model's context.

The session behind issue 29's write figures grows as a real working session
does: the 2.1.332-shaped head of `session.py` (system prompt, tools, git status,
environment), then turn after turn of tool calls whose results are the sizes a
coding agent reads (seeded text of ours, no agent's prompt text):

| step | turns of every 30 | its tool result, tokens at scale 1.0 |
|---|---|---|
| `read` a source file | 2 | 2,000-8,000 (numbered lines) |
| `test` run | 1 | 1,000-4,000 (one line per test, a summary) |
| `grep` | 4 | 200-1,500 |
| `edit` | 12 | a short confirmation; the call carries old and new text of 40-300 |
| `bash` | 9 | 30-400 |
| `answer` to the user, who asks the next thing | 2 | (the user's message: 40-200) |

Every turn is one request of the main lane; the conversation's title request is
sent beside its first turn. The turns are planned at full size, from a random
source of their own, 30 at a time in a shuffled order (so every stretch of the
conversation reads files, runs tests and edits alike): steps follow until the next one's nominal size would take
the prompt past `context_tokens` (less a margin for the reply), which gives
100-120 turns with the default 128K context. `scale` shrinks every prompt size
but keeps the plan (the same turns, each smaller), so a 2-core CPU can replay
all of them through a server; replies are as long as the 2.1.332 session's at
every scale.

    python -m stable_prefix.bench.workload.long_session --scale 0.1 --out /tmp/long   # writes NNNN-<lane>.json
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from stable_prefix.addons.lanes import SESSION_ID_HEADER
from stable_prefix.bench.workload.session import (
    ENVIRONMENT_TOKENS,
    MAIN_INSTRUCTIONS_TOKENS,
    MAIN_LANE,
    MAIN_MODEL,
    TODAYS_TOOLS,
    TODAYS_TOOLS_TOKENS,
    Request,
    _TodaysSessionBuilder,
)

DEFAULT_CONTEXT_TOKENS = 131_072
MIN_TURNS = 100
# What a turn's tool result is, how many of every DECK turns, and its size range in tokens at scale 1.0
# (an edit's range is its call's old and new text; its result is one line).
STEPS: dict[str, tuple[int, tuple[int, int]]] = {
    "read": (2, (2_000, 8_000)),
    "test": (1, (1_000, 4_000)),
    "grep": (4, (200, 1_500)),
    "edit": (12, (40, 300)),
    "bash": (9, (30, 400)),
    "answer": (2, (40, 200)),
}
DECK = sum(count for count, _ in STEPS.values())
# The head's nominal size at full scale, and what a turn adds besides its tool result (the assistant's
# text before its call, the call, the chat template's markers).
HEAD_TOKENS = MAIN_INSTRUCTIONS_TOKENS + TODAYS_TOOLS_TOKENS + ENVIRONMENT_TOKENS
TURN_OVERHEAD_TOKENS = 100
# Room kept below the context for the reply and the nominal sizes' error: rendered (JSON-escaped numbered
# code lines, tool calls), a turn takes about 1.2x its nominal size.
CONTEXT_MARGIN = 0.8


def plan_turns(seed: int, context_tokens: int) -> list[tuple[str, float]]:
    """(step, nominal tokens at full size) for each turn, until the next would pass the context's share."""
    rng = random.Random(f"long-session-{seed}")
    deck = [kind for kind, (count, _) in STEPS.items() for _ in range(count)]
    plan, size = [], HEAD_TOKENS
    while True:
        if len(plan) % DECK == 0:
            rng.shuffle(deck)
        kind = deck[len(plan) % DECK]
        tokens = rng.uniform(*STEPS[kind][1])
        size += tokens + TURN_OVERHEAD_TOKENS
        if size > context_tokens * CONTEXT_MARGIN:
            return plan
        plan.append((kind, tokens))


class _LongSessionBuilder(_TodaysSessionBuilder):
    def __init__(self, seed: int, scale: float, context_tokens: int):
        super().__init__(seed, scale, per_request_cch=False)
        self.seed, self.context_tokens = seed, context_tokens

    def _step(self, kind: str, tokens: float) -> list[dict]:
        """The assistant's turn that ends this request and what the user sends back (`tokens` at full size)."""
        if kind == "answer":
            return self._answer_round()
        path = f"/home/dev/{self.project}/{self.text.source_path()}"
        if kind == "read":
            call, output = self._tool_use("Read", {"file_path": path}), self.text.file_read(tokens)
        elif kind == "test":
            call = self._tool_use("Bash", {"command": f"pytest -q tests/test_{self.text.identifier()}.py", "description": self.text.sentence(3, 6)})
            output = self.text.command_output(tokens)
        elif kind == "grep":
            call = self._tool_use("Grep", {"pattern": self.text.identifier(), "output_mode": "content", "-n": True})
            output = self.text.grep_output(tokens)
        elif kind == "edit":
            old, new = self.text.file_read(tokens / 2), self.text.file_read(tokens / 2)
            call = self._tool_use("Edit", {"file_path": path, "old_string": old, "new_string": new})
            output = f"The file {path} has been updated."
        else:
            call = self._tool_use("Bash", {"command": f"git {self.rng.choice(('status', 'diff --stat', 'log --oneline -5'))}", "description": self.text.sentence(3, 6)})
            output = self.text.grep_output(tokens)
        result = {"type": "tool_result", "tool_use_id": call["id"], "content": output}
        return [self._assistant([call]), {"role": "user", "content": [result]}]

    def build(self) -> list[Request]:
        history = self._opening(0)
        suffix, headers = self.text.hex(3), {SESSION_ID_HEADER: "session-long"}
        tools = self._tools(tuple(TODAYS_TOOLS))
        system = self._system(suffix, self.main_instructions, subagent=False)
        for number, (kind, tokens) in enumerate(plan_turns(self.seed, self.context_tokens)):
            index = self._emit(MAIN_LANE, 0, self._body(MAIN_MODEL, system, history, tools, 32_000), headers)
            if number == 0:
                self.title_request(0, history[0]["content"][-1]["text"], suffix, index, headers)
            turn = self._step(kind, tokens)
            self._answered(index, turn[0])
            history += turn
        return self.requests


def generate_long_session(seed: int = 0, scale: float = 1.0, *, context_tokens: int = DEFAULT_CONTEXT_TOKENS) -> list[Request]:
    """The long session (see the module docstring): main-lane turns until the prompt fills `context_tokens` x `scale`."""
    if not 0 < scale <= 4:
        raise ValueError(f"scale={scale!r}: must be in (0, 4]; 1.0 is full size (~23K-token head, {DEFAULT_CONTEXT_TOKENS:,}-token context)")
    if context_tokens < 32_768:
        raise ValueError(f"context_tokens={context_tokens!r}: a coding agent's head alone is ~23K tokens; give at least 32,768")
    return _LongSessionBuilder(seed, scale, context_tokens).build()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stable_prefix.bench.workload.long_session", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scale", type=float, default=1.0, help="1.0 = full size")
    parser.add_argument("--context-tokens", type=int, default=DEFAULT_CONTEXT_TOKENS, help="the context the conversation grows to (at scale 1.0)")
    parser.add_argument("--out", type=Path, required=True, help="directory for NNNN-<lane>.json request bodies")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for request in generate_long_session(args.seed, args.scale, context_tokens=args.context_tokens):
        (args.out / f"{request.index:04d}-{request.lane}.json").write_bytes(request.body_bytes())
    print(f"wrote {len(list(args.out.glob('*.json')))} requests to {args.out}")


if __name__ == "__main__":
    main()
