"""Comparing requests pairwise: the prefix diagnosis plus a structural diff.

The prefix part is `addons.diagnosis` (the proxy's own code). The structural
part is deepdiff over the two bodies read as prompt order reads them
(`canonical_value`: no `cache_control`, a one-text-block content list as its
text; Responses input items without `id` and `status`): those differences
move every turn and change nothing the model reads.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

from deepdiff import DeepDiff

from stable_prefix.addons import responses_input
from stable_prefix.addons.diagnosis import Diagnosis, PrefixDiagnosis, PromptSnapshot
from stable_prefix.addons.normalize import Rules, normalize
from stable_prefix.addons.prompt_order import canonical_value
from stable_prefix.addons.request_shape import Api
from stable_prefix.addons.response_chains import ResponseChains
from stable_prefix.captures.inputs import RequestFile

DEFAULT_RULES = Rules()
VALUE_CHARS = 60
_CHANGE_KINDS = {
    "values_changed": "changed",
    "type_changes": "changed",
    "dictionary_item_added": "added",
    "iterable_item_added": "added",
    "dictionary_item_removed": "removed",
    "iterable_item_removed": "removed",
}


@dataclass(frozen=True)
class PathChange:
    path: str
    kind: str  # "changed", "added", "removed"
    old: Any
    new: Any

    def abbreviated(self) -> tuple[str | None, str | None]:
        """Old and new value, shortened; two strings are shown from shortly
        before the place they start to differ."""
        if isinstance(self.old, str) and isinstance(self.new, str):
            shared = next((i for i, (x, y) in enumerate(zip(self.old, self.new)) if x != y), min(len(self.old), len(self.new)))
            start = max(0, shared - VALUE_CHARS // 3)
            if start:
                return ("…" + abbreviate(self.old[start:])[1:], "…" + abbreviate(self.new[start:])[1:])
        return abbreviate(self.old), abbreviate(self.new)

    def to_json(self) -> dict:
        old, new = self.abbreviated()
        return {"path": self.path, "kind": self.kind, "old": old, "new": new}


@dataclass(frozen=True)
class Pair:
    previous: RequestFile
    current: RequestFile
    diagnosis: Diagnosis
    changes: list[PathChange]

    def to_json(self) -> dict:
        return {
            "previous": str(self.previous.path),
            "current": str(self.current.path),
            **self.diagnosis.to_json(),
            "changed_paths": [change.path for change in self.changes],
            "changes": [change.to_json() for change in self.changes],
            "usage": (self.current.response or {}).get("usage"),
        }


def abbreviate(value: Any) -> str | None:
    if value is _ABSENT:
        return None
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= VALUE_CHARS else text[: VALUE_CHARS - 1] + "…"


_ABSENT = object()


def format_path(keys: list) -> str:
    path = ""
    for key in keys:
        path += f"[{key}]" if isinstance(key, int) else (f".{key}" if path else str(key))
    return path


def as_read(body: dict, api: Api) -> Any:
    """A body as prompt order reads it (see the module docstring)."""
    if api == "responses" and isinstance(body.get("input"), list):
        body = {**body, "input": [responses_input.rendered(item) for item in body["input"]]}
    return canonical_value(body)


def changed_paths(before: dict, after: dict, api: Api) -> list[PathChange]:
    diff = DeepDiff(as_read(before, api), as_read(after, api), view="tree")
    changes = []
    for report_type, levels in diff.items():
        kind = _CHANGE_KINDS.get(report_type, report_type)
        for level in levels:
            old = level.t1 if kind != "added" else _ABSENT
            new = level.t2 if kind != "removed" else _ABSENT
            changes.append(PathChange(format_path(level.path(output_format="list")), kind, old, new))
    return sorted(changes, key=lambda change: _sort_key(change.path))


_PROMPT_RANK = {"system": 0, "instructions": 0, "tools": 1, "messages": 2, "input": 2}


def _sort_key(path: str) -> list:
    # Prompt order first; "messages[10]" after "messages[9]".
    parts = path.replace("]", "").replace("[", ".").split(".")
    return [_PROMPT_RANK.get(parts[0], 3)] + [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in parts]


def normalized_copy(request: RequestFile) -> dict:
    body = copy.deepcopy(request.client_body)
    normalize(body, request.api, DEFAULT_RULES)
    return body


def backend_body(request: RequestFile) -> dict:
    """What the backend saw (capture record) or would see (raw body through the default rules)."""
    return request.forwarded_body if request.forwarded_body is not None else normalized_copy(request)


def diff(a: RequestFile, b: RequestFile, *, normalized: bool) -> tuple[Pair, list[str]]:
    """Compare two requests as sent by the client, or (`normalized`) as the
    default rules would forward them. Also returns warnings for the reader."""
    bodies = [normalized_copy(r) if normalized else r.client_body for r in (a, b)]
    tracker = PrefixDiagnosis()
    lanes = [tracker.lane_names.name_for(PromptSnapshot.of(r.client_body, r.api, r.headers).signature) for r in (a, b)]
    warnings = []
    if a.api != b.api:
        warnings.append(f"{a.path} is an {a.api} request, {b.path} an {b.api} one; prompt orders differ by construction")
    if lanes[0] != lanes[1]:
        warnings.append(f"different lanes ({lanes[0]} vs {lanes[1]}): these are different agents, a prefix break is expected")
    for request, body in zip((a, b), bodies, strict=True):
        result = tracker.observe(PromptSnapshot.of(request.client_body, request.api, request.headers), body, lane=lanes[1])
    return Pair(a, b, result, changed_paths(bodies[0], bodies[1], b.api)), warnings


class BackendReading:
    """Requests read in their order as the backend saw them: a Responses request that continues a captured
    response is read with that response's history (what the server held)."""

    def __init__(self) -> None:
        self.chains = ResponseChains()

    def bodies(self, request: RequestFile) -> tuple[dict, dict]:
        """(the body the backend saw, the client's body), each with its Responses history resolved."""
        body, client_body = backend_body(request), request.client_body
        if request.api == "responses":
            answer = request.response or {}
            forwarded, body, client_body = body, self.chains.resolved(body), self.chains.resolved(client_body)
            if answer.get("status") == 200:
                self.chains.remember(forwarded, {"id": answer.get("response_id"), "output": answer.get("output")})
        return body, client_body


def change_lines(changes: list[PathChange]) -> list[str]:
    """The changed paths as `diff` prints them: `~ path  old → new`, `+ path  new`, `- path  old`."""
    lines = [f"changed paths (cache_control, one-text-block lists and Responses item ids ignored, as in prompt order): {len(changes)}"]
    width = max((len(change.path) for change in changes), default=0)
    for change in changes:
        old, new = change.abbreviated()
        if change.kind == "added":
            lines.append(f"  + {change.path:<{width}}  {new}")
        elif change.kind == "removed":
            lines.append(f"  - {change.path:<{width}}  {old}")
        else:
            lines.append(f"  ~ {change.path:<{width}}  {old} → {new}")
    return lines


def report(requests: list[RequestFile]) -> tuple[list[Pair], PrefixDiagnosis]:
    """Consecutive requests of each lane, as the backend saw them (`BackendReading`)."""
    tracker = PrefixDiagnosis()
    reading = BackendReading()
    previous_by_lane: dict[str, tuple[RequestFile, dict]] = {}
    pairs = []
    for request in requests:
        body, client_body = reading.bodies(request)
        result = tracker.observe(PromptSnapshot.of(client_body, request.api, request.headers), body, lane=request.lane)
        if result.lane in previous_by_lane:
            previous, previous_body = previous_by_lane[result.lane]
            pairs.append(Pair(previous, request, result, changed_paths(previous_body, body, request.api)))
        previous_by_lane[result.lane] = (request, body)
    return pairs, tracker
