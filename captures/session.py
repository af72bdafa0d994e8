"""A capture session read for its page (`session_html.py`): per lane, each request's tokens reused and
prefilled, its time to first token and, where its prefix broke, the cause and the diff.

The figures are the records' own (`addons/capture.py`): reuse is the server's own figure read by
`stable_prefix.usage` (a server that does not report reuse leaves it unknown, never 0), the break is the
diagnosis the proxy wrote when the request passed, and the diff is `diff`'s (`pairs.changed_paths` over the
bodies as the backend saw them, `pairs.BackendReading`). `SessionReader` reads a folder that grows, as the
live page does: each call parses only the records that appeared since the last.
"""

from __future__ import annotations

import json
import statistics
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from stable_prefix.addons.capture import RECORD_FORMAT
from stable_prefix.addons.capture_folder import record_number
from stable_prefix.captures import pairs
from stable_prefix.captures.inputs import InputError, parse
from stable_prefix.live import live_line
from stable_prefix.usage import prompt_tokens_in_usage, reuse_in_record

RECORD_FILES = "[0-9]*-*.json"
MIN_REQUESTS_FOR_SLOPE = 3  # with different prefilled tokens
COLD = "first request of its lane"
KEPT = "prefix kept: the turn's new tokens"


@dataclass(frozen=True)
class Break:
    """Where a request's prefix broke, as the proxy's diagnosis named it, and what changed."""

    cause: str
    path: str | None  # the first divergence in prompt order
    byte_offset: int | None
    previous: Path | None  # the lane's request before it (None: its body could not be read)
    diff_lines: tuple[str, ...]  # `diff`'s changed paths; empty when a body is missing

    @property
    def where(self) -> str:
        return f"{self.path} byte {self.byte_offset:,}" if self.path is not None and self.byte_offset is not None else "?"


@dataclass(frozen=True)
class RequestBar:
    seq: int
    path: Path
    lane: str
    prompt_tokens: int | None  # as the server counted them
    reused_tokens: int | None  # None: the server did not say
    ttft_s: float | None  # None: not streamed, or failed
    first_in_lane: bool
    line: str  # the live line (`stable-prefix up`'s): what a hover shows
    broke: Break | None = None

    @property
    def prefilled_tokens(self) -> int | None:
        return None if self.prompt_tokens is None or self.reused_tokens is None else self.prompt_tokens - self.reused_tokens

    @property
    def cost_group(self) -> str:
        """What its prefill is charged to: the cause of its break, its lane's cold start, or a kept prefix."""
        return self.broke.cause if self.broke else COLD if self.first_in_lane else KEPT


@dataclass(frozen=True)
class PrefillRate:
    """Prompt tokens prefilled per second, measured on the session's requests that report both their prefilled
    tokens and a TTFT. `slope`: the least-squares slope of TTFT against prefilled tokens, so the part of a TTFT
    that does not grow with the prefill (the first token's decode, the queue, the proxy: the intercept,
    `fixed_s`) is not taken for prefill. `ratio`, where there are too few requests for a slope or the TTFTs did
    not grow with the prefill: the sum of prefilled tokens over the sum of those TTFTs, a lower bound on the rate."""

    seconds_per_token: float
    fixed_s: float | None  # the slope's intercept; None for a ratio
    requests: int
    tokens: int
    method: str  # "slope" or "ratio"

    @property
    def tokens_per_s(self) -> float:
        return 1.0 / self.seconds_per_token

    def seconds_for(self, tokens: int) -> float:
        return tokens * self.seconds_per_token


@dataclass(frozen=True)
class CostGroup:
    name: str
    requests: int
    prefilled_tokens: int  # of the requests whose split is known
    unknown: int  # requests whose prefilled tokens are unknown
    ttft_s: float  # measured, summed over the requests that have one
    breaks: bool  # a cause of breaks (not the cold start or kept prefixes)


@dataclass
class Session:
    folder: Path
    lanes: dict[str, list[RequestBar]] = field(default_factory=dict)  # in the order lanes first appeared
    skipped: list[str] = field(default_factory=list)  # files not read, and why

    @property
    def requests(self) -> list[RequestBar]:
        return sorted((bar for bars in self.lanes.values() for bar in bars), key=lambda bar: bar.seq)

    @property
    def breaks(self) -> list[RequestBar]:
        return [bar for bar in self.requests if bar.broke]

    def prefill_rate(self) -> PrefillRate | None:
        timed = [bar for bar in self.requests if bar.prefilled_tokens and bar.ttft_s]
        tokens, seconds = [bar.prefilled_tokens for bar in timed], [bar.ttft_s for bar in timed]
        if len(set(tokens)) >= MIN_REQUESTS_FOR_SLOPE:
            slope, intercept = statistics.linear_regression(tokens, seconds)
            if slope > 0:
                return PrefillRate(slope, intercept, len(timed), sum(tokens), "slope")
        return PrefillRate(sum(seconds) / sum(tokens), None, len(timed), sum(tokens), "ratio") if timed else None

    def cost_groups(self) -> list[CostGroup]:
        """Every request's prefill, charged to a break's cause, a cold start or a kept prefix; causes first,
        the most tokens first."""
        members: dict[str, list[RequestBar]] = {}
        for bar in self.requests:
            members.setdefault(bar.cost_group, []).append(bar)
        groups = [
            CostGroup(name, len(bars), sum(bar.prefilled_tokens or 0 for bar in bars), sum(bar.prefilled_tokens is None for bar in bars),
                      sum(bar.ttft_s or 0.0 for bar in bars), name not in (COLD, KEPT))
            for name, bars in members.items()
        ]
        return sorted(groups, key=lambda group: (not group.breaks, -group.prefilled_tokens, group.name))

    def totals(self) -> dict:
        bars = self.requests
        known = [bar for bar in bars if bar.prefilled_tokens is not None]
        return {
            "requests": len(bars),
            "lanes": len(self.lanes),
            "prompt_tokens": sum(bar.prompt_tokens for bar in known),
            "reused_tokens": sum(bar.reused_tokens for bar in known),
            "prefilled_tokens": sum(bar.prefilled_tokens for bar in known),
            "reuse_unknown": len(bars) - len(known),
            "breaks": Counter(bar.broke.cause for bar in bars if bar.broke),
            "ttft_s": sum(bar.ttft_s or 0.0 for bar in bars),
            "ttft_unknown": sum(bar.ttft_s is None for bar in bars),
        }


def record_files(folder: Path) -> list[Path]:
    """The capture records in `folder`, by number (they are linked into place whole: every match is complete)."""
    return sorted((path for path in folder.glob(RECORD_FILES) if record_number(path) is not None), key=record_number)


class SessionReader:
    """A session folder read as it grows. Records appear in number order but for concurrent requests, which
    may finish out of order; only a lane's own order matters (its bars, its diffs), and concurrent requests are
    nearly always of different lanes (a fan-out's instances). So a late record is placed where it is, and
    only one numbered before its own lane's last makes the call read the folder again, in order. Safe to call
    from several threads."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._lock = threading.Lock()
        self._start()

    def _start(self) -> None:
        self.session = Session(self.folder)
        self.read_names: set[str] = set()
        self.last_in_lane: dict[str, int] = {}  # per lane: the number of its last record read
        self.reading = pairs.BackendReading()
        self.previous_body: dict[str, tuple[Path, dict | None]] = {}  # per lane: its last request and the body the backend saw

    def read(self) -> Session:
        with self._lock:
            if not self.folder.is_dir():
                return self.session
            for path in [path for path in record_files(self.folder) if path.name not in self.read_names]:
                if not self._add(path):
                    self._start()
                    for every in record_files(self.folder):
                        self._add(every)
                    break
            return self.session

    def _add(self, path: Path) -> bool:
        """Read one record into its lane; False, reading nothing, when its lane already holds a later one."""
        try:
            document = json.loads(path.read_bytes())
        except (OSError, ValueError) as error:
            self.read_names.add(path.name)
            self.session.skipped.append(f"{path.name}: unreadable ({error})")
            return True
        lane, number = str((document.get("lane") if isinstance(document, dict) else None) or "unknown"), record_number(path)
        if number < self.last_in_lane.get(lane, 0):
            return False
        self.read_names.add(path.name)
        if not isinstance(document, dict) or document.get("format") != RECORD_FORMAT:
            self.session.skipped.append(f"{path.name}: not a capture record")
            return True
        self.last_in_lane[lane] = number
        try:
            body = self.reading.bodies(parse(path, document))[0]
        except InputError:
            body = None  # a body that was not JSON: drawn from its usage, with no diff to give
        bars = self.session.lanes.setdefault(lane, [])
        previous = self.previous_body.get(lane)
        self.previous_body[lane] = (path, body)
        bars.append(request_bar(path, document, lane, first_in_lane=not bars, broke=lane_break(document, previous, body)))
        return True


def request_bar(path: Path, record: dict, lane: str, *, first_in_lane: bool, broke: Break | None) -> RequestBar:
    response = record.get("response") or {}
    reuse = reuse_in_record(response)
    prompt_tokens, reused = reuse if reuse else (prompt_tokens_in_usage(response.get("usage") or {}), None)
    ttft = response.get("ttft_s")
    return RequestBar(int(record.get("seq") or record_number(path)), path, lane, prompt_tokens, reused,
                      ttft if isinstance(ttft, (int, float)) else None, first_in_lane, live_line(record), broke)


def lane_break(record: dict, previous: tuple[Path, dict | None] | None, body: dict | None) -> Break | None:
    """The record's diagnosis of a broken prefix, with `diff`'s changed paths from the lane's previous request."""
    diagnosis = record.get("diagnosis") or {}
    if diagnosis.get("prefix_kept") is not False:
        return None
    divergence = diagnosis.get("first_divergence") or {}
    lines: tuple[str, ...] = ()
    if previous is not None and previous[1] is not None and body is not None:
        api = (record.get("request") or {}).get("api") or "anthropic"
        lines = tuple(pairs.change_lines(pairs.changed_paths(previous[1], body, api)))
    return Break(str(diagnosis.get("cause") or "unnamed"), divergence.get("path"), divergence.get("byte_offset"),
                 previous[0] if previous else None, lines)


def read_session(folder: Path) -> Session:
    """The whole session in `folder`; InputError names a folder that holds no capture records."""
    if not folder.is_dir():
        raise InputError(f"{folder}: not a directory")
    session = SessionReader(folder).read()
    if not session.lanes:
        raise InputError(f"{folder}: no capture records (NNNN-<lane>.json){'; ' + '; '.join(session.skipped[:3]) if session.skipped else ''}")
    return session
