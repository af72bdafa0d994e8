"""How long the model needs to prefill a warm request's new tokens on top of the
prefix it reused: the unavoidable compute of a warm turn, and the fair yardstick
for "warm TTFT <= 1.3x the time to prefill only the new tokens".

`bench.probes.prefill_reference` times N tokens prefilled from nothing. A warm
request's N new tokens must attend over everything cached before them, and with
the tiny model on a CPU attention dominates, so they cost more than N tokens
from nothing: no cache can reach that yardstick. Here the same model (the
server's model directory, loaded in-process with mlx-lm, after the servers have
stopped) is given exactly what an ideal engine does for such a request:

1. the reused prefix tokens are prefilled into a fresh `make_prompt_cache(model)`
   (untimed: that is what the cache saved),
2. the new tokens are prefilled on top of it and the last position's logits
   evaluated (timed), as mlx-lm's generator (and so vllm-mlx) does: chunks of
   `PREFILL_STEP` that only fill the cache, then the last token's logits;
   the cache is trimmed back and this is repeated, the median is kept.

The token ids are the ones `bench.workload.prompt_tokens` renders (token-exact with the
servers), split at the reused count the replay measured.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Hashable
from pathlib import Path

PREFILL_STEP = 2048  # mlx-lm's default prefill_step_size, which vllm-mlx uses too


class InContextPrefill:
    """Times prefilling a prompt's new tokens after its cached prefix, with the model in `model_dir`.

    One cache is kept between measurements and trimmed back to the prefix the next
    prompt shares with it, so measuring many prompts of a growing conversation
    costs about one replay of it (`measure_all` orders prompts so that those
    sharing a prefix are neighbours). The timed part is always the same: the new
    tokens on top of exactly `reused` cached ones.
    """

    def __init__(self, model_dir: Path, repeats: int = 3):
        from mlx_lm import load
        from mlx_lm.models.cache import make_prompt_cache

        self.model, _ = load(str(model_dir))
        self.repeats = repeats
        self._cache = make_prompt_cache(self.model)
        self._cached: list[int] = []  # the tokens whose KV state self._cache holds

    def _feed(self, tokens: list[int], logits: bool) -> None:
        """Prefill `tokens` into the cache as mlx-lm's generator does: every position but
        the last only fills the cache (the output projection is never computed for it);
        with `logits`, the last position's logits are computed and evaluated too."""
        import mlx.core as mx

        body = tokens[:-1] if logits else tokens
        for start in range(0, len(body), PREFILL_STEP):
            self.model(mx.array(body[start : start + PREFILL_STEP])[None], cache=self._cache)
            mx.eval([c.state for c in self._cache])
        if logits:
            mx.eval(self.model(mx.array(tokens[-1:])[None], cache=self._cache)[:, -1, :])
        self._cached += tokens

    def _trim_to(self, length: int) -> None:
        from mlx_lm.models.cache import trim_prompt_cache

        if length < len(self._cached):
            trim_prompt_cache(self._cache, len(self._cached) - length)
            self._cached = self._cached[:length]

    def seconds(self, tokens: list[int], reused: int) -> float:
        """Median time to prefill `tokens[reused:]` on top of `tokens[:reused]` already cached."""
        from stable_prefix.bench.workload.prompt_tokens import common_prefix_length

        if not 0 <= reused < len(tokens):
            raise ValueError(f"in-context prefill: {reused} reused tokens of a {len(tokens)}-token prompt; at least one token must be new")
        self._trim_to(min(reused, common_prefix_length(self._cached, tokens)))
        self._feed(tokens[len(self._cached) : reused], logits=False)  # untimed: what the cache saved
        timings = []
        for _ in range(self.repeats):
            started = time.perf_counter()
            self._feed(tokens[reused:], logits=True)
            timings.append(time.perf_counter() - started)
            self._trim_to(reused)
        return statistics.median(timings)

    def measure_all(self, prompts: dict[Hashable, tuple[list[int], int]]) -> dict[Hashable, float]:
        """{key: seconds} for {key: (tokens, reused)}; equal (tokens, reused) are measured once."""
        measured: dict[tuple[int, ...], float] = {}
        for tokens, reused in sorted(prompts.values(), key=lambda prompt: prompt[0]):
            identity = (reused, *tokens)
            if identity not in measured:
                measured[identity] = self.seconds(tokens, reused)
        return {key: measured[(reused, *tokens)] for key, (tokens, reused) in prompts.items()}
