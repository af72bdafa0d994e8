"""How far a verify forward's log-probabilities are from one-token steps' over the same tokens: the margin rule's bound.

A drafted step feeds k tokens in one forward; decoding without drafts feeds them
one at a time. The sums run in another order, so the log-probabilities differ
in the last bits, and a greedy near tie can fall the other way
(`engine_patch/drafts/verification.py`). This measures the difference, per
model and dtype, in-process with mlx-lm:

- the reference: the prompt prefilled, then `steps` greedy one-token steps, each
  position's log-probabilities kept;
- the drafted decode of the same tokens, every draft confirmed: forwards of
  `draft + 1` tokens, each followed by two one-token steps on the cache they wrote;
- `verify`: the largest |difference| at the verify's positions; `after`: at the
  one-token steps that follow (what a cache a wider forward wrote carries on);
  `flips`: positions whose argmax differs.

The bound in verification.py (MEASURED_ERROR) is the largest `verify` over these
runs, per dtype.

    python -m stable_prefix.bench.probes.verify_error build/tiny-model-test build/tiny-nemotron_h build/tiny-gemma3_text
    python -m stable_prefix.bench.probes.verify_error build/smollm2-135m --dtypes float32   # as loaded; cast to float16 its
                                                                                              # quantized layers run ~40x slower here
"""

from __future__ import annotations

import argparse

PROMPT = "def add(a, b):\n    return a + b\n\nclass Stack:\n    def push(self, x):\n        self.items.append(x)\n" * 2
DTYPES = ("float32", "float16", "bfloat16")


def log_probabilities(mx, logits):
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def prefilled(mx, model, prompt: list[int]):
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    model(mx.array(prompt[:-1])[None], cache=cache)
    return cache


def measure(path: str, dtype: str, steps: int, draft: int) -> dict[str, float | int]:
    import mlx.core as mx
    import mlx_lm

    model, tokenizer = mlx_lm.load(path)
    model.set_dtype(getattr(mx, dtype))
    prompt = tokenizer.encode(PROMPT)
    cache = prefilled(mx, model, prompt)
    tokens, reference = [prompt[-1]], []
    for _ in range(steps):
        position = log_probabilities(mx, model(mx.array(tokens[-1:])[None], cache=cache)[0, -1])
        mx.eval(position)
        reference.append(position)
        tokens.append(int(mx.argmax(position)))
    cache = prefilled(mx, model, prompt)
    measured: dict[str, list[tuple[int, object]]] = {"verify": [], "after": []}
    done = 0
    while done < steps:
        fed = tokens[done : done + draft + 1]
        positions = log_probabilities(mx, model(mx.array(fed)[None], cache=cache)[0])
        mx.eval(positions)
        measured["verify"] += [(done + index, positions[index]) for index in range(len(fed)) if done + index < steps]
        done += len(fed)
        for _ in range(2):
            if done >= steps:
                break
            position = log_probabilities(mx, model(mx.array(tokens[done : done + 1])[None], cache=cache)[0, -1])
            mx.eval(position)
            measured["after"].append((done, position))
            done += 1

    def largest(pairs) -> float:
        return max(float(mx.max(mx.abs(got.astype(mx.float32) - reference[at].astype(mx.float32)))) for at, got in pairs)

    return {"verify": largest(measured["verify"]), "after": largest(measured["after"]),
            "flips": sum(int(mx.argmax(got)) != int(mx.argmax(reference[at])) for kind in measured.values() for at, got in kind)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--dtypes", nargs="+", default=DTYPES, choices=DTYPES)
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--draft", type=int, default=4, help="draft tokens per verify forward")
    options = parser.parse_args()
    print("| model | dtype | verify | after | flips |\n|---|---|---|---|---|")
    for path in options.models:
        for dtype in options.dtypes:
            try:
                figures = measure(path, dtype, options.steps, options.draft)
            except RuntimeError as error:  # e.g. gpt-oss's GatherMM runs only in float32 on a CPU
                print(f"| {path} | {dtype} | not run: {error} | | |", flush=True)
                continue
            print(f"| {path} | {dtype} | {figures['verify']:.3g} | {figures['after']:.3g} | {figures['flips']} |", flush=True)


if __name__ == "__main__":
    main()
