"""Does mlx-lm's `BatchGenerator` answer a hybrid prompt prefilled beside a longer one as alone?

    python -m tests.support.padded_prefill_check [--fixed] MODEL...           # the venv's mlx-lm (0.31)
    PYTHONPATH=build/mlx-lm-0.32 python -m tests.support.padded_prefill_check MODEL...

For each model: the greedy tokens of a short prompt alone, and of the same
prompt inserted together with a three times longer one (one prefill batch,
so the short one is right-padded), through mlx-lm's own generator without
vllm-mlx. `--fixed` installs our recurrent padding fix first. Prints one JSON
object: model path -> whether the answer beside the longer prompt equals the
answer alone.
"""

from __future__ import annotations

import argparse
import json

import mlx_lm
from mlx_lm.generate import BatchGenerator

TEXT = "The parser reads each request line by line and hands the body to the router. "
MAX_TOKENS = 12


def greedy(model, prompts: list[list[int]]) -> list[list[int]]:
    generator = BatchGenerator(model, max_tokens=MAX_TOKENS, prefill_batch_size=8)
    uids = generator.insert(prompts)
    tokens: dict[int, list[int]] = {uid: [] for uid in uids}
    while any(len(answer) < MAX_TOKENS for answer in tokens.values()):
        for response in generator.next_generated():
            tokens[response.uid].append(response.token)
    generator.close()
    return [tokens[uid] for uid in uids]


def answered_as_alone(model_path: str) -> bool:
    model, tokenizer = mlx_lm.load(model_path)
    short = tokenizer.encode(TEXT * 4)
    longer = tokenizer.encode(TEXT * 12)
    (alone,) = greedy(model, [short])
    _, beside = greedy(model, [longer, short])
    return beside == alone


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fixed", action="store_true", help="install the recurrent padding fix first")
    parser.add_argument("models", nargs="+")
    args = parser.parse_args()
    if args.fixed:
        from stable_prefix.engine_patch.vllm_mlx.batched import recurrent_padding_fix

        recurrent_padding_fix.install()
    print(json.dumps({path: answered_as_alone(path) for path in args.models}))


if __name__ == "__main__":
    main()
