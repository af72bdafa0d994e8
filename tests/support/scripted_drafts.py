"""Draft proposers whose drafts a test chooses, so every path of a verify step is taken on purpose.

The tiny random-weight models rarely copy their prompt, so the suffix proposer
alone would seldom draft there. `ScriptedProposer` drafts what a function of
the tokens generated so far says: the reference answer itself (every draft
confirmed), the reference with tokens changed at random (drafts cut short at
chosen depths), or a table of the target's most likely tokens (the sampled
test). It has the proposer's interface (`extend`, `propose`), so the engines
run it exactly as they run the real one.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence


class ScriptedProposer:
    def __init__(self, prompt: Sequence[int], continuation: Callable[[tuple[int, ...], int], list[int]]):
        self.prompt_length = len(prompt)
        self.generated: list[int] = []
        self.continuation = continuation

    def extend(self, tokens: Sequence[int]) -> None:
        self.generated.extend(int(token) for token in tokens)

    def propose(self, count: int) -> list[int]:
        return self.continuation(tuple(self.generated), count)[:count]


def scripted(continuation: Callable[[tuple[int, ...], int], list[int]]) -> Callable[..., ScriptedProposer]:
    """A proposer factory for `Drafting(proposer=...)`."""
    return lambda prompt, other_lanes=None, quoted=None: ScriptedProposer(prompt, continuation)


def noisy_reference(reference: Sequence[int], kept: float = 0.75, seed: int = 0) -> Callable[[tuple[int, ...], int], list[int]]:
    """Drafts of the reference answer's next tokens, each replaced by a wrong one with probability 1 - `kept`.

    Off the reference (an answer that already differs) it drafts nothing, so a
    wrong answer shows as a difference, never as a crash.
    """
    generator = random.Random(seed)

    def continuation(generated: tuple[int, ...], count: int) -> list[int]:
        if list(generated) != list(reference[: len(generated)]):
            return []
        wanted = reference[len(generated) : len(generated) + count]
        return [token if generator.random() < kept else (token + 7) % 100_000 for token in wanted]

    return continuation


def by_prompt(continuations: dict[tuple[int, ...], Callable[[tuple[int, ...], int], list[int]]]) -> Callable[..., ScriptedProposer]:
    """A proposer factory drafting, for each prompt it knows, with that prompt's continuation (nothing for others)."""
    return lambda prompt, other_lanes=None, quoted=None: ScriptedProposer(prompt, continuations.get(tuple(prompt), lambda generated, count: []))
