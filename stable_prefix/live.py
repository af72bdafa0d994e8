"""One line per request while the stack runs, read from the proxy's capture records.

The capture record (`addons/capture.py`) is the one source: it is written when
a request is complete and holds the lane, the server's own figures for the
prompt tokens and the part it reused (its usage, or llama.cpp's timings: `usage.py`), the time to the first generated output and the prefix
diagnosis. A figure the record lacks is shown as `?`, never as 0.

    #3 main · 11,733 prompt tok · 11,702 reused · TTFT 0.65 s · prefix stable 92,476/92,625 B (99.8%) · first change messages[12]

With captures off (`stable-prefix up --no-capture`) nothing is recorded, and
the line is the proxy's own diagnosis line from its log (`LogFollower`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from stable_prefix.usage import reuse_in_record


def _count(value: int | None) -> str:
    return f"{value:,}" if value is not None else "?"


def live_line(record: dict) -> str:
    response = record.get("response") or {}
    reuse = reuse_in_record(response)
    prompt_tokens, reused = reuse if reuse else (None, None)
    parts = [f"#{record.get('seq', '?')} {record.get('lane', 'unknown')}"]
    status = response.get("status")
    if status != 200:
        parts.append(f"error: {response['error']}" if response.get("error") else f"HTTP {status}")
    parts += [f"{_count(prompt_tokens)} prompt tok", f"{_count(reused)} reused"]
    ttft = response.get("ttft_s")
    parts.append(f"TTFT {ttft:.2f} s" if ttft is not None else "TTFT ?")
    diagnosis = (record.get("diagnosis") or {}).get("line")
    if diagnosis:
        # The diagnosis line opens with its lane, already shown.
        parts.append(diagnosis.removeprefix(f"lane {record.get('lane')} · "))
    return " · ".join(parts)


class CaptureFollower:
    """The records that appeared in a capture session folder since the last call, oldest first."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.seen: set[str] = set()

    def new_records(self) -> list[dict]:
        records = []
        # Records are linked into place when complete (a temporary file first), so every match is whole.
        for path in sorted(self.folder.glob("[0-9]*-*.json"), key=lambda path: int(path.name.split("-")[0])):
            if path.name in self.seen:
                continue
            self.seen.add(path.name)
            try:
                records.append(json.loads(path.read_text(encoding="utf-8")))
            except (OSError, ValueError) as error:
                records.append({"seq": int(path.name.split("-")[0]), "response": {"error": f"unreadable record {path}: {error}"}})
        return records

    def new_lines(self) -> list[str]:
        return [live_line(record) for record in self.new_records()]


# mitmdump's log line: `[12:00:01.123] message`; the diagnosis line starts with `lane `.
_DIAGNOSIS_LOG_LINE = re.compile(r"^\[[0-9:.]+\] (lane .*)$")


class LogFollower:
    """The diagnosis lines the proxy logged since the last call (when there are no capture records to read)."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.offset = 0

    def new_lines(self) -> list[str]:
        try:
            with self.log_path.open("rb") as log:
                log.seek(self.offset)
                text = log.read()
        except OSError:
            return []
        complete = text[: text.rfind(b"\n") + 1]  # a line being written waits for the next call
        self.offset += len(complete)
        matches = (_DIAGNOSIS_LOG_LINE.match(line) for line in complete.decode("utf-8", "replace").splitlines())
        return [match.group(1) for match in matches if match]
