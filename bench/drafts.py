"""Drafted decoding on real weights: target forward passes per output token, by reply kind, against Rapid-MLX.

An agent's replies copy what it was given: an Edit's `old_string` repeats lines it
just read, a Write repeats a file with one change, a tool call repeats a path, a
report quotes a grep. The tasks here are built from real code no one here wrote
(functions of Python's standard library, read from the installed files, and a
grep of their module), one of each reply kind per function plus plain chat, as
raw prompts (the model's chat template and the start of its reply: the tool call's
opening, the report's first line), so every engine gets the same tokens.

Per configuration, each prompt is sent greedy (and, where drafting may act, once
more sampled at temperature 0.7), one at a time, to a server of its own:

- ours, `--draft on` (the batched engine, the product's mode): what a Mac would draft;
- ours, `--draft off`: the reference; its greedy answers must be ours-on's, token for token;
- ours at the default `--draft auto`: what it decides on this CPU (its curve, its decision);
- Rapid-MLX 0.16.10 with `--suffix-decoding` (its own venv and HOME; one greedy sequence
  at a time, so sampled requests fall through by design).

The figure is hardware-independent: target forward passes while decoding over the tokens
decoded (ours: `decode_steps` / `decode_tokens` of /v1/cache/stats; Rapid-MLX: its
`suffix_decode_verify_steps` + `fallthrough_steps` over completion tokens, from
/metrics), with the share of drafted tokens accepted. Then the verify-cost curve of
this CPU (k = 1..8, all widths measured) and, labelled as a projection, the decode time
per token where a k-token verify costs one step.

    python -m stable_prefix.bench.drafts [--model build/smollm2-135m] [--functions 3] [--out bench/results/drafts]
    python -m stable_prefix.bench.drafts --turn-times ROUNDS [--model build/tiny-model-bench]   # auto against off, paired
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import json
import re
import statistics
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from stable_prefix.bench.clients.stack import CONFIGURATIONS, RAPID_MLX_VERSION, SERVED_MODEL_NAME, started
from stable_prefix.servers import REPO_ROOT

DEFAULT_MODEL = REPO_ROOT / "build" / "smollm2-135m"
DEFAULT_OUT = REPO_ROOT / "bench" / "results" / "drafts"
# Short functions (98-156 SmolLM2 tokens): this CPU prefills SmolLM2-135M at ~13 tokens/s.
FUNCTIONS = ("shlex.quote", "string.capwords", "glob.escape", "textwrap.indent", "fnmatch.filter")
KINDS = ("edit", "write", "tool_call", "report", "chat")
CHAT_QUESTIONS = ("In two sentences, what does a Python generator do?", "Why do people write unit tests? Answer briefly.",
                  "What is the difference between a list and a tuple in Python?", "Give one tip for naming variables well.",
                  "What does an HTTP 404 status mean?")
SYSTEM = "You are a coding agent. You read files, then change them with the Edit and Write tools. Tool calls are JSON."
MAX_TOKENS = 80
SAMPLED = {"temperature": 0.7, "top_p": 0.95}
PATCHED = CONFIGURATIONS[2]  # the patched engine, its default (batched) mode, direct
RAPID_MLX = CONFIGURATIONS[7]  # Rapid-MLX direct
RAPID_SUFFIX_FLAGS = ("--suffix-decoding",)


@dataclass(frozen=True)
class Task:
    kind: str
    source: str  # the function the task is built from (module.name)
    prompt: str  # the rendered chat and the reply's start


@dataclass
class Measured:
    config: str
    kind: str
    source: str
    sampled: bool
    text: str
    tokens: int
    forward_passes: int | None
    proposed: int | None
    accepted: int | None
    seconds: float


# --- tasks from real code ----------------------------------------------------------


def real_function(dotted: str) -> tuple[str, str, str]:
    """(its source, its module's file path, the grep of `def`/`class` lines in that file)."""
    module_name, name = dotted.rsplit(".", 1)
    module = importlib.import_module(module_name)
    path = inspect.getsourcefile(module)
    lines = Path(path).read_text().splitlines()
    grep = "\n".join(f"{path}:{number}:{line}" for number, line in enumerate(lines, 1) if re.match(r"(def|class) ", line))
    return inspect.getsource(getattr(module, name)), path, grep


TOOLS = ('Tools: Read {"file_path": string}; Edit {"file_path": string, "old_string": string, "new_string": string}; '
         'Write {"file_path": string, "content": string}. Call one as <tool_call>{"name": ..., "arguments": {...}}</tool_call>.')


def build_tasks(tokenizer: Any, functions: int) -> list[Task]:
    """Per function, a reply of each kind as an agent writes it, started the way the model would start it."""
    tasks = []
    for index, dotted in enumerate(FUNCTIONS[:functions]):
        source, path, grep = real_function(dotted)
        name = dotted.rsplit(".", 1)[1]
        shown = f"Read {path}:\n```python\n{source}```\n"
        asks = {
            # An Edit's old_string: the lines it just read, repeated.
            "edit": (f"{shown}Replace the docstring of `{name}`. First show the old lines (old_string), then the new ones (new_string).",
                     "old_string:\n```python\n"),
            # A Write: the file it read, with one change.
            "write": (f"{shown}Write the whole function back with one change: add a comment line `# {name}` above its first line.", "```python\n"),
            # A tool call: argument names from the tool list, a path from a grep.
            "tool_call": (f"Grep for definitions returned:\n{grep}\nRead the file that defines `{name}`.",
                          '<tool_call>\n{"name": "Read", "arguments": {"file_path": "'),
            "report": (f"Grep for definitions returned:\n{grep}\nReport what the grep found, quoting each line.", "The grep found:\n"),
            "chat": (CHAT_QUESTIONS[index % len(CHAT_QUESTIONS)], ""),
        }
        for kind in KINDS:
            ask, reply_start = asks[kind]
            messages = [{"role": "system", "content": f"{SYSTEM} {TOOLS}"}, {"role": "user", "content": ask}]
            rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            tasks.append(Task(kind, dotted, rendered + reply_start))
    return tasks


# --- one server's figures --------------------------------------------------------------


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=60) as response:
        return response.read().decode()


def _complete(base_url: str, prompt: str, sampled: bool) -> tuple[str, int, float]:
    body = {"model": SERVED_MODEL_NAME, "prompt": prompt, "max_tokens": MAX_TOKENS, "stream": False,
            **(SAMPLED if sampled else {"temperature": 0.0})}
    request = urllib.request.Request(f"{base_url}/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    started_at = time.perf_counter()
    with urllib.request.urlopen(request, timeout=1800) as response:
        payload = json.loads(response.read())
    return payload["choices"][0]["text"], payload["usage"]["completion_tokens"], time.perf_counter() - started_at


def ours_counters(base_url: str) -> tuple[int, int, int]:
    stats = json.loads(_get(f"{base_url}/v1/cache/stats"))
    return stats["decode_steps"], stats["draft_proposed"], stats["draft_accepted"]


RAPID_COUNTERS = {"verify": "rapid_mlx_suffix_decode_verify_steps_total", "fallthrough": "rapid_mlx_suffix_decode_fallthrough_steps_total",
                  "proposed": "rapid_mlx_suffix_decode_draft_tokens_proposed_total", "accepted": "rapid_mlx_suffix_decode_draft_tokens_accepted_total"}


def rapid_counters(base_url: str) -> tuple[int, int, int]:
    """Rapid-MLX's own suffix-decoding counters (its /metrics): forwards (verify + plain), proposed, accepted."""
    text = _get(f"{base_url}/metrics")
    value = {}
    for key, name in RAPID_COUNTERS.items():
        match = re.search(rf"^{name}\{{[^}}]*\}} ([0-9.e+]+)$", text, re.MULTILINE)
        value[key] = int(float(match.group(1))) if match else 0
    return value["verify"] + value["fallthrough"], value["proposed"], value["accepted"]


def measure(config_name: str, base_url: str, tasks: list[Task], counters, sampled_too: bool = True) -> list[Measured]:
    rows = []
    for task in tasks:
        for sampled in (False, True) if sampled_too else (False,):
            before = counters(base_url)
            text, tokens, seconds = _complete(base_url, task.prompt, sampled)
            after = counters(base_url)
            passes, proposed, accepted = (later - earlier for later, earlier in zip(after, before))
            rows.append(Measured(config_name, task.kind, task.source, sampled, text, tokens, passes, proposed, accepted, seconds))
            print(f"  {config_name:>10} {task.kind:>9} {'sampled' if sampled else 'greedy ':>7} {tokens:3d} tokens, {passes} forwards, "
                  f"{accepted}/{proposed} drafted accepted, {seconds:.1f} s", flush=True)
    return rows


def decision(base_url: str) -> dict[str, Any]:
    return json.loads(_get(f"{base_url}/v1/cache/stats"))["draft_decision"]


# --- figures --------------------------------------------------------------------------


def per_kind(rows: list[Measured]) -> dict[str, dict[str, Any]]:
    """Forward passes per output token and acceptance, per configuration, decoding and reply kind."""
    table: dict[str, dict[str, Any]] = {}
    for row in rows:
        key = f"{row.config}/{'sampled' if row.sampled else 'greedy'}"
        cell = table.setdefault(key, {}).setdefault(row.kind, {"tokens": 0, "forward_passes": 0, "proposed": 0, "accepted": 0, "requests": 0})
        cell["tokens"] += row.tokens
        cell["forward_passes"] += row.forward_passes or 0
        cell["proposed"] += row.proposed or 0
        cell["accepted"] += row.accepted or 0
        cell["requests"] += 1
    for kinds in table.values():
        for cell in kinds.values():
            cell["passes_per_token"] = round(cell["forward_passes"] / cell["tokens"], 3) if cell["tokens"] else None
            cell["acceptance"] = round(cell["accepted"] / cell["proposed"], 3) if cell["proposed"] else None
    return table


def exact_greedy(rows: list[Measured], drafted: str, reference: str) -> dict[str, Any]:
    """Whether each greedy answer with drafts is the reference's, text for text."""
    answers = {(row.kind, row.source): row.text for row in rows if row.config == reference and not row.sampled}
    compared = [(row.kind, row.source, row.text == answers.get((row.kind, row.source))) for row in rows if row.config == drafted and not row.sampled]
    return {"compared": len(compared), "identical": sum(same for *_, same in compared),
            "different": [f"{kind} {source}" for kind, source, same in compared if not same]}


def cost_curve(model_dir: Path) -> dict[str, Any]:
    """This CPU's verify-cost curve, every width measured, and the one-token step it is relative to."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache

    from stable_prefix.engine_patch.drafts.cost_gate import break_even_acceptance
    from stable_prefix.engine_patch.drafts.verify_cost import measure_verify_cost

    model, _ = load(str(model_dir))
    curve = measure_verify_cost(model, rounds=5, stop_early=False)
    cache = make_prompt_cache(model)
    model(mx.array(list(range(100, 132)))[None], cache=cache)
    steps = []
    for token in range(20):
        started_at = time.perf_counter()
        mx.eval(model(mx.array([[100 + token]]), cache=cache))
        steps.append(time.perf_counter() - started_at)
    return {**curve.describe(), "one_token_step_s": statistics.median(steps[5:]), "break_even_acceptance": break_even_acceptance(curve)}


def projection(table: dict[str, Any], step_s: float) -> dict[str, Any]:
    """PROJECTION: decode seconds per output token where a verify of k drafted tokens costs one step
    (decode bound by reading the weights), ours-on greedy against plain decoding, by reply kind."""
    greedy = table.get("ours-on/greedy", {})
    return {kind: {"plain_s_per_token": round(step_s, 4), "drafted_s_per_token": round(cell["passes_per_token"] * step_s, 4),
                   "speed_up": round(1 / cell["passes_per_token"], 2) if cell["passes_per_token"] else None}
            for kind, cell in greedy.items() if cell["passes_per_token"]}


TARGETS = {"write": 0.35, "edit": 0.5, "tool_call": 0.85, "chat": 1.0}


def targets(table: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets on ours-on greedy (a Write repeats code it was given: the 0.35 target), and against Rapid-MLX."""
    ours, rapid = table.get("ours-on/greedy", {}), table.get("rapid-suffix/greedy", {})
    out = {}
    for kind, bound in TARGETS.items():
        value = (ours.get(kind) or {}).get("passes_per_token")
        out[kind] = {"target": bound, "ours": value, "met": None if value is None else value <= bound}
    out["better_than_rapid_mlx"] = {kind: {"ours": (ours.get(kind) or {}).get("passes_per_token"), "rapid_mlx": (rapid.get(kind) or {}).get("passes_per_token")}
                                    for kind in KINDS}
    return out


# --- the run ----------------------------------------------------------------------------


@contextlib.contextmanager
def _server(config, model_dir: Path, log_dir: Path, flags: tuple[str, ...]):
    with started(config, model_dir, log_dir, engine_flags=flags) as endpoints:
        yield endpoints.server_url


def run(model_dir: Path, functions: int, out: Path, with_rapid: bool = True) -> dict[str, Any]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    tasks = build_tasks(tokenizer, functions)
    print(f"{len(tasks)} tasks from {', '.join(FUNCTIONS[:functions])}; {model_dir}", flush=True)
    rows: list[Measured] = []
    decisions = {}
    with tempfile.TemporaryDirectory(prefix="bench-drafts-") as logs:
        log_dir = Path(logs)
        # Greedy and sampled where drafting may act; the reference and the default greedy only.
        for name, flags, sampled_too in (("ours-off", ("--draft", "off"), False), ("ours-on", ("--draft", "on"), True), ("ours-auto", (), False)):
            with _server(PATCHED, model_dir, log_dir, flags) as url:
                rows += measure(name, url, tasks, ours_counters, sampled_too)
                decisions[name] = decision(url)
        if with_rapid:
            with _server(RAPID_MLX, model_dir, log_dir, RAPID_SUFFIX_FLAGS) as url:
                rows += measure("rapid-suffix", url, tasks, rapid_counters)
    table = per_kind(rows)
    curve = cost_curve(model_dir)
    result = {
        "model": str(model_dir.relative_to(REPO_ROOT) if model_dir.is_relative_to(REPO_ROOT) else model_dir),
        "functions": list(FUNCTIONS[:functions]),
        "max_tokens": MAX_TOKENS,
        "sampled": SAMPLED,
        "rapid_mlx": f"Rapid-MLX {RAPID_MLX_VERSION} {' '.join(RAPID_SUFFIX_FLAGS)}" if with_rapid else None,
        "per_kind": table,
        "exact_greedy": exact_greedy(rows, "ours-on", "ours-off"),
        "auto_decision": decisions.get("ours-auto"),
        "cost_curve": curve,
        "projection": projection(table, curve["one_token_step_s"]),
        "targets": targets(table),
        "rows": [asdict(row) for row in rows],
        "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "latest.json").write_text(json.dumps(result, indent=2) + "\n")
    from stable_prefix.bench.measure.drafts_report import markdown

    (out / "latest.md").write_text(markdown(result))
    print(f"wrote {out / 'latest.json'} and {out / 'latest.md'}")
    return result


def turn_times(model_dir: Path, functions: int, rounds: int, out: Path) -> dict[str, Any]:
    """The default (`--draft auto`) against `--draft off` on this CPU: the same greedy requests to both,
    alternating which goes first, each request's turn time paired; the median ratio with its 95% interval."""
    from transformers import AutoTokenizer

    from stable_prefix.bench.measure.metrics import median_confidence_interval

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    tasks = build_tasks(tokenizer, functions)
    pairs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-drafts-turns-") as logs, contextlib.ExitStack() as stack:
        urls = {name: stack.enter_context(_server(PATCHED, model_dir, Path(logs), flags))
                for name, flags in (("auto", ()), ("off", ("--draft", "off")))}
        for url in urls.values():  # each prompt prefilled once before timing: the turns compare decode and what the gate adds
            for task in tasks:
                _complete(url, task.prompt, sampled=False)
        for round_index in range(rounds):
            for task in tasks:
                order = ("auto", "off") if (round_index + len(pairs)) % 2 == 0 else ("off", "auto")
                timed = {}
                for name in order:
                    text, tokens, seconds = _complete(urls[name], task.prompt, sampled=False)
                    timed[name] = (text, tokens, seconds)
                pairs.append({"kind": task.kind, "source": task.source, "auto_s": timed["auto"][2], "off_s": timed["off"][2],
                              "same_answer": timed["auto"][0] == timed["off"][0], "tokens": timed["off"][1]})
                print(f"  {task.kind:>9}: auto {timed['auto'][2]:.2f} s, off {timed['off'][2]:.2f} s", flush=True)
        auto_decision = decision(urls["auto"])
        auto_stats = json.loads(_get(f"{urls['auto']}/v1/cache/stats"))
    ratios = [pair["auto_s"] / pair["off_s"] for pair in pairs]
    result = {
        "model": str(model_dir), "pairs": len(pairs), "median_ratio": statistics.median(ratios), "ci95": median_confidence_interval(ratios),
        "same_answers": sum(pair["same_answer"] for pair in pairs), "auto_decision": auto_decision,
        "auto_drafted": {"draft_proposed": auto_stats["draft_proposed"], "draft_verify_steps": auto_stats["draft_verify_steps"]},
        "rows": pairs, "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    out.mkdir(parents=True, exist_ok=True)
    name = f"turn-times-{model_dir.name}.json"
    (out / name).write_text(json.dumps(result, indent=2) + "\n")
    low, high = result["ci95"] or (float("nan"), float("nan"))
    print(f"turn time, --draft auto over --draft off: {result['median_ratio']:.3f}x [{low:.3f}, {high:.3f}] over {len(pairs)} pairs; "
          f"auto drafted {auto_stats['draft_proposed']} tokens; wrote {out / name}")
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stable_prefix.bench.drafts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--functions", type=int, default=3, help=f"how many of {', '.join(FUNCTIONS)} to build tasks from (default 3)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--no-rapid-mlx", dest="rapid", action="store_false", help="leave Rapid-MLX out")
    parser.add_argument("--turn-times", type=int, metavar="ROUNDS",
                        help="instead: the default (auto) against --draft off, ROUNDS rounds of the tasks, paired turn times")
    args = parser.parse_args(argv)
    if args.turn_times:
        turn_times(args.model, args.functions, args.turn_times, args.out)
    else:
        run(args.model, args.functions, args.out, args.rapid)


if __name__ == "__main__":
    main()
