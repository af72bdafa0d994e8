"""What a self-hosted server needs of a request that the client does not send:
the model name it serves, and a `max_tokens` it accepts.

Not about the prompt prefix: these change no byte the model reads. Two
changes, each logged as a `Change` named `model` or `max_tokens`; their options
are declared here (`OPTIONS`) and read once per configuration
(`settings_from_options`), a bad value refused naming the option and the value.
"""

from __future__ import annotations

import fnmatch

from mitmproxy import exceptions

from stable_prefix.addons.rules.base import Change, Option

MODEL = "model"
MAX_TOKENS = "max_tokens"
UPSTREAM_MODEL = Option("upstream_model", str, "", "Send every request with this model name (the name the server serves).")
MODEL_MAP = Option(
    "model_map", str, "",
    "Map requested model names: comma-separated pattern=name pairs, shell patterns, first match wins, "
    "e.g. 'claude-*haiku*=small-model,claude-*=big-model'. Checked before upstream_model.",
)
MAX_TOKENS_CAP = Option("max_tokens_cap", int, 0, "Lower max_tokens (and max_completion_tokens) to at most this; 0: no cap.")
OPTIONS = (UPSTREAM_MODEL, MODEL_MAP, MAX_TOKENS_CAP)


def parse_model_map(spec: str) -> tuple[tuple[str, str], ...]:
    """`claude-*haiku*=small,claude-*=big` -> ((pattern, name), ...).

    Raises ValueError naming the entry that is not `pattern=name`.
    """
    pairs = []
    for entry in spec.split(","):
        entry = entry.strip()
        if not entry:
            continue
        pattern, sep, name = entry.partition("=")
        if not sep or not pattern.strip() or not name.strip():
            raise ValueError(f"entry {entry!r} is not of the form pattern=served-model-name")
        pairs.append((pattern.strip(), name.strip()))
    return tuple(pairs)


def settings_from_options(options) -> dict:
    """`model_map` (the patterns, then `upstream_model` for every other name) and `max_tokens_cap`,
    as `normalize.Rules` takes them; raises OptionsError naming a bad value."""
    try:
        model_map = parse_model_map(options.model_map)
    except ValueError as error:
        raise exceptions.OptionsError(f"model_map={options.model_map!r}: {error}") from error
    if options.upstream_model.strip():
        model_map += (("*", options.upstream_model.strip()),)  # after the patterns: they win
    if options.max_tokens_cap < 0:
        raise exceptions.OptionsError(f"max_tokens_cap={options.max_tokens_cap}: must be 0 (no cap) or a positive number of tokens")
    return {"model_map": model_map, "max_tokens_cap": options.max_tokens_cap}


def map_model(body: dict, model_map: tuple[tuple[str, str], ...]) -> list[Change]:
    requested = body.get("model")
    if not isinstance(requested, str):
        return []
    for pattern, served in model_map:
        if fnmatch.fnmatchcase(requested, pattern):
            if served == requested:
                return []
            body["model"] = served
            return [Change(MODEL, "model", f"{requested} -> {served}")]
    return []


def cap_max_tokens(body: dict, cap: int) -> list[Change]:
    changes = []
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > cap:
            changes.append(Change(MAX_TOKENS, key, f"{value} -> {cap}"))
            body[key] = cap
    return changes
