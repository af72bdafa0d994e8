"""Hybrid prompts in flight, prefilled together (recurrent_padding_fix) against one at a time (before it).

In process, through vllm-mlx's continuous-batching scheduler (its own cache
off, the fix installed): a fan-out group of `--prompts` prompts of different lengths
arrives at once, with no cache to restore from, and each is answered with
`--max-tokens` greedy tokens; the wall time of the group is measured with
vllm-mlx's default prefill batch (8: prefilled together, unpadded) and with
`prefill_batch_size=1` (one prompt per prefill, as the batched engine ran
hybrids before the fix), the two alternating `--repeats` times so the
machine's load falls on both alike; the answers of both must be equal. Prints
the medians and the paired ratio with its bootstrap 95% interval.

    python -m stable_prefix.bench.probes.prefill_together --model build/tiny-qwen3_5
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from stable_prefix.bench.measure.metrics import median_confidence_interval

TASK = "Explore the repository and report on the {} code, file by file, with what each function does. "


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stable_prefix.bench.probes.prefill_together", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=1, help="greedy tokens per answer (default 1: the prefill alone)")
    parser.add_argument("--repeats", type=int, default=6)
    args = parser.parse_args(argv)

    import mlx_lm
    from vllm_mlx.request import Request, SamplingParams
    from vllm_mlx.scheduler import Scheduler, SchedulerConfig

    from stable_prefix.engine_patch.vllm_mlx.batched import recurrent_padding_fix

    recurrent_padding_fix.install()
    model, tokenizer = mlx_lm.load(str(args.model))
    topics = ["parser", "storage layer", "network stack", "command line", "test suite", "build"]
    prompts = [TASK.format(topics[index % len(topics)]) * (6 + 5 * index) for index in range(args.prompts)]

    def group(prefill_batch_size: int) -> tuple[float, list[list[int]]]:
        scheduler = Scheduler(model, tokenizer, SchedulerConfig(enable_prefix_cache=False, prefill_batch_size=prefill_batch_size))
        answers: dict[str, list[int]] = {}
        started = time.perf_counter()
        for index, text in enumerate(prompts):
            params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
            scheduler.add_request(Request(request_id=f"instance-{index}", prompt=text, sampling_params=params))
            answers[f"instance-{index}"] = []
        while scheduler.has_requests():
            for output in scheduler.step().outputs:
                answers[output.request_id] += list(output.new_token_ids)
        return time.perf_counter() - started, [answers[key] for key in sorted(answers)]

    group(8)  # kernels set up, allocations made
    times: dict[int, list[float]] = {8: [], 1: []}
    answers: dict[int, list[list[int]]] = {}
    for repeat in range(args.repeats):
        for size in (8, 1) if repeat % 2 else (1, 8):
            seconds, answers[size] = group(size)
            times[size].append(seconds)
    ratios = [together / alone for together, alone in zip(times[8], times[1])]
    low, high = median_confidence_interval(ratios) or (float("nan"), float("nan"))
    lengths = ", ".join(str(len(tokenizer.encode(text))) for text in prompts)
    print(f"{args.model}: {args.prompts} prompts in flight ({lengths} tokens), {args.max_tokens} greedy tokens each, {args.repeats} pairs")
    print(f"  prefilled together (unpadded): {statistics.median(times[8]):.2f} s; one prompt per prefill: {statistics.median(times[1]):.2f} s; "
          f"together / one at a time {statistics.median(ratios):.2f}x [{low:.2f}, {high:.2f}]; answers {'equal' if answers[8] == answers[1] else 'DIFFER'}")


if __name__ == "__main__":
    main()
