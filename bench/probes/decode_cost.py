"""What one decode step costs against prefill, for a model on this machine.

A turn's time is its prefill and its decode; a benchmark of turns is only as
representative as the model's ratio of the two. A real model on a Mac decodes one
token in the time it prefills about 7-14 prompt tokens (dense models, one request
at a time; `docs/benchmark.md` cites the figures). The tiny random-weight models
have a tiny body and Qwen's whole vocabulary, so their output projection (151,936
x hidden) is most of a decode step. This measures, in-process with mlx-lm, as
mlx-lm's generator runs them:

- the decode step: one token on top of a `context`-token cache, its logits and
  the argmax evaluated (median of 30 after 5 warm-up steps);
- the output projection alone: one hidden state times the tied embedding;
- the in-context prefill: `new` tokens on top of the same cache (chunks that only
  fill the cache, then the last token's logits: `bench.probes.incontext_prefill`);

and prints the step in prefill tokens: step / (in-context prefill time / new).

    python -m stable_prefix.bench.probes.decode_cost --model build/tiny-model-bench --context 2048 6000
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

PREFILL_STEP = 2048


def measure(model_dir: Path, contexts: list[int], new_tokens: int, dtype: str | None = None) -> list[dict[str, float]]:
    import mlx.core as mx
    import numpy as np
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache

    model, _ = load(str(model_dir))
    if dtype:
        model.set_dtype(getattr(mx, dtype))
    rng = np.random.default_rng(0)

    def prefill(cache, ids: list[int]):
        for start in range(0, len(ids) - 1, PREFILL_STEP):
            model(mx.array(ids[start : min(start + PREFILL_STEP, len(ids) - 1)])[None], cache=cache)
            mx.eval([c.state for c in cache])
        logits = model(mx.array(ids[-1:])[None], cache=cache)[:, -1, :]
        mx.eval(logits)
        return logits

    prefill(make_prompt_cache(model), rng.integers(0, 150_000, 600).tolist())  # kernels set up, allocations made
    head = model.model.embed_tokens.weight
    figures = []
    for context in contexts:
        cache = make_prompt_cache(model)
        prefill(cache, rng.integers(0, 150_000, context).tolist())
        started = time.perf_counter()
        logits = prefill(cache, rng.integers(0, 150_000, new_tokens).tolist())
        incontext = time.perf_counter() - started
        token = mx.argmax(logits, axis=-1)
        steps = []
        for _ in range(35):
            started = time.perf_counter()
            token = mx.argmax(model(token[:, None], cache=cache)[:, -1, :], axis=-1)
            mx.eval(token)
            steps.append(time.perf_counter() - started)
        projections = []
        for _ in range(20):
            hidden = mx.random.normal((1, head.shape[1])).astype(head.dtype)
            mx.eval(hidden)
            started = time.perf_counter()
            mx.eval(hidden @ head.T)
            projections.append(time.perf_counter() - started)
        step = statistics.median(steps[5:])
        figures.append({
            "context": context,
            "decode_step_ms": step * 1000,
            "output_projection_ms": statistics.median(projections) * 1000,
            "incontext_prefill_tokens_per_s": new_tokens / incontext,
            "decode_step_in_prefill_tokens": step / (incontext / new_tokens),
        })
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stable_prefix.bench.probes.decode_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--context", type=int, nargs="+", default=[2048, 6000], help="cached tokens under the step (default 2048 6000)")
    parser.add_argument("--new", type=int, default=300, help="tokens of the in-context prefill (default 300)")
    parser.add_argument("--dtype", choices=["float16", "bfloat16", "float32"], help="cast the model first (default: as stored)")
    args = parser.parse_args(argv)
    for figure in measure(args.model, args.context, args.new, args.dtype):
        print(
            f"{args.model} ({args.dtype or 'as stored'}), {figure['context']:,} tokens cached: decode step {figure['decode_step_ms']:.1f} ms "
            f"(output projection {figure['output_projection_ms']:.1f} ms), in-context prefill {figure['incontext_prefill_tokens_per_s']:,.0f} tokens/s: "
            f"one step = {figure['decode_step_in_prefill_tokens']:.1f} prefill tokens"
        )


if __name__ == "__main__":
    main()
