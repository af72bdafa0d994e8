"""`python -m stable_prefix.captures diff|report`: what changed between requests, and where
the prompt prefix broke. Exit status: 0 done, 2 bad input."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from stable_prefix.addons.diagnosis import rule_note
from stable_prefix.addons.rules import RULES
from stable_prefix.captures import pairs
from stable_prefix.captures.inputs import InputError, RequestFile, files_in, load
from stable_prefix.captures.session import Session, read_session
from stable_prefix.captures.session_html import render
from stable_prefix.usage import reuse_in_record


def describe(request: RequestFile) -> str:
    kind = f"capture record, lane {request.lane}" if request.is_capture else "raw request body"
    return f"{request.path}  ({kind}, {request.api})"


def cause(pair: pairs.Pair) -> str:
    result = pair.diagnosis
    if result.prefix_broke:
        return result.cause
    if result.neutralized:
        return "raw: " + rule_note(result.neutralized.rule, applied=True)
    return "-"


def print_changes(changes: list[pairs.PathChange]) -> None:
    print("\n".join(pairs.change_lines(changes)))


def run_diff(args) -> None:
    a, b = load(args.a), load(args.b)
    pair, warnings = pairs.diff(a, b, normalized=args.normalized)
    if args.json:
        print(json.dumps({"normalized": args.normalized, "warnings": warnings, **pair.to_json()}, indent=2, ensure_ascii=False))
        return
    print(f"A  {describe(a)}")
    print(f"B  {describe(b)}")
    if args.normalized:
        print("compared: after the default rules (billing header stripped, system messages rewritten) = what the backend sees")
    else:
        print("compared: as the client sent them (--normalized: as the backend would see them)")
    for warning in warnings:
        print(f"warning: {warning}")
    print()
    print(pair.diagnosis.line())
    print()
    print_changes(pair.changes)


def run_report(args) -> None:
    if args.html:
        session = write_page(Path(args.directory), Path(args.html))
        print(f"{args.html}: {len(session.requests):,} requests in {len(session.lanes)} lanes, {len(session.breaks)} prefix break{'s' * (len(session.breaks) != 1)}")
        return
    requests = [load(path) for path in files_in(args.directory)]
    found, tracker = pairs.report(requests)
    if args.json:
        print(json.dumps({"directory": str(args.directory), "requests": len(requests), "pairs": [p.to_json() for p in found], "lanes": tracker.totals(), "groups": tracker.group_totals()}, indent=2, ensure_ascii=False))
        return
    print(f"{args.directory}: {len(requests)} requests, {len(found)} consecutive pairs per lane, compared as the backend saw them")
    rows = [("request", "lane", "prefix", "stable/total B", "ratio", "first divergence", "cause", "cached", "changed")]
    for pair in found:
        result = pair.diagnosis
        comparison = result.comparison
        divergence = comparison.first_divergence
        reuse = reuse_in_record(pair.current.response or {})  # the server's own figure, or unknown
        rows.append(
            (
                pair.current.label,
                result.lane,
                "broke" if result.prefix_broke else "kept",
                f"{comparison.stable_prefix_bytes:,}/{comparison.total_bytes:,}",
                f"{comparison.stable_prefix_ratio:.1%}",
                f"{divergence.path} @{divergence.byte_offset:,}" if divergence else "identical",
                cause(pair),
                f"{reuse[1]:,}" if reuse is not None else "?",
                str(len(pair.changes)),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    print()
    print("per lane:")
    for line in tracker.summary_lines():
        print(f"  {line}")


def write_page(directory: Path, page: Path) -> Session:
    """The session page of the capture folder `directory` written to `page`; returns the session drawn."""
    session = read_session(directory)
    try:
        page.write_text(render(session), encoding="utf-8")
    except OSError as error:
        raise InputError(f"{page}: cannot write the page ({error.strerror or error})") from error
    return session


def parser() -> argparse.ArgumentParser:
    rules = ", ".join(f"{rule.name} ({rule.label})" for rule in RULES)
    top = argparse.ArgumentParser(
        prog="python -m stable_prefix.captures",
        description="What changed between Claude Code requests, and where their prompt prefix broke. "
        "Inputs are capture records (addons/capture.py) or raw request bodies. "
        f"Breaks are attributed to these rules: {rules}. Exit status 2 on bad input.",
    )
    commands = top.add_subparsers(dest="command", required=True)
    diff = commands.add_parser("diff", help="compare two requests (capture records or raw request bodies)")
    diff.add_argument("a", help="the earlier request")
    diff.add_argument("b", help="the later request")
    diff.add_argument("--normalized", action="store_true", help="apply the addon's default rules first (what the backend sees)")
    diff.add_argument("--json", action="store_true", help="machine-readable output")
    diff.set_defaults(run=run_diff)
    report = commands.add_parser("report", help="pair consecutive requests per lane across a capture folder")
    report.add_argument("directory", help="a session folder, e.g. captures/sessions/20261130-051200")
    report.add_argument("--json", action="store_true", help="machine-readable output")
    report.add_argument("--html", metavar="FILE", help="write the session's page instead (per lane: tokens reused and prefilled, TTFT, "
                        "each break's cause and diff; what the prefill cost); opens from disk")
    report.set_defaults(run=run_report)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        args.run(args)
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `... | head`: the reader left; not an error of ours
        sys.stdout = None
    return 0
