"""What each agent's real CLI does when the answer it is reading is cut: resend, or lose the turn.

    python -m stable_prefix.bench.probes.agent_cuts                      # -> bench/results/agent-cuts/latest.{json,md}
    python -m stable_prefix.bench.probes.agent_cuts --agents qwen,pi --forms error-event --recovery off,replay

Each run is one agent's first turn (its CLI as a user runs it: its own retry settings) through our proxy
(`addons/strip_billing.py`) before a relay (`bench/clients/cut_relay.py`) that breaks off the first streamed
answer as a dead replica does, before one patched engine. The forms of cut (`FORMS`): mid-reply (after
`MID_REPLY_EVENTS` events carrying output) or before the first such event; told with the protocol's error
event (the proxy's `answer_engine_failures`, on by default) or silently (off: the connection just ends).
`--recovery` runs each form with the proxy's `stream_recovery` set to each value given (`off`: the agent
alone). What the run records per agent and form: the CLI's exit status and answer, every request that
reached the engine after the cut (a resend repeats the cut request's conversation), and what that makes of
the turn (`outcome`): resent by the agent, completed by the proxy, or lost.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from stable_prefix.addons.stream_recovery import RECOVERED_NOTE
from stable_prefix.bench.clients.agent_clients import NOT_STREAMED, RESUMED, STREAMED
from stable_prefix.bench.clients.cli_agents import AGENTS, TurnResult, conversation
from stable_prefix.bench.clients.cut_relay import Cut, CutRelay, cut_relay
from stable_prefix.bench.clients.stack import UNBUFFERED, cpu_description, stop_servers_on_sigterm
from stable_prefix.servers import REPO_ROOT, VENV_BIN, free_port, http_ok, mitmdump_command, running

DEFAULT_MODEL = REPO_ROOT / "build" / "tiny-model-failover"
DEFAULT_OUT = REPO_ROOT / "bench" / "results" / "agent-cuts"
SERVED_MODEL = "tiny-failover"
# The agents' output cap: about the model's ~400-token replies, and a bound on a turn's time on a loaded CPU.
MAX_OUTPUT_TOKENS = 512
TURN_TIMEOUT_S = 900.0
MID_REPLY_EVENTS = 20
# Asked in turn until a reply is long enough to be cut (greedy replies of the tiny model end where they end).
PROMPTS = ("Explain what this project does, in detail.", "Describe how this project is built, step by step.",
           "Tell me everything about the files in this project.")
# The turn's own request, not a title request sent before it (opencode's): every agent's turn carries its tools.
TURN_REQUEST_BYTES = 4000


@dataclass(frozen=True)
class CutForm:
    key: str
    title: str
    after_content_events: int
    error_event: bool  # the proxy ends the cut stream with the protocol's error event (else: a silent cut)


FORMS = {form.key: form for form in (
    CutForm("error-event", f"mid-reply (after {MID_REPLY_EVENTS} output events), ended with the protocol's error event", MID_REPLY_EVENTS, True),
    CutForm("silent", f"mid-reply (after {MID_REPLY_EVENTS} output events), cut silently", MID_REPLY_EVENTS, False),
    CutForm("error-event-before-content", "before the first output event, ended with the error event", 0, True),
    CutForm("silent-before-content", "before the first output event, cut silently", 0, False),
)}
RECOVERY_VALUES = ("off", "replay", "continue")


def outcome(relay: CutRelay, returncode: int, reply: str, completed_by_proxy: bool) -> dict[str, Any]:
    """What became of the turn, from what reached the engine after the cut, the proxy's log and what the CLI said.
    A request after the cut that opens as the cut one did (system and first prompt) is the agent's: the same
    request again, or (more messages: the partial answer and a request to go on) a resumption."""
    requests = relay.api_requests()
    cut = next((request for request in requests if request.cut), None)
    if cut is None:
        return {"outcome": "not cut", "detail": "no streamed answer was cut (the reply ended first)", "resends": [], "resent_as": None}
    again = [request for request in requests if request.started > cut.started and request.head == cut.head and request.path == cut.path]
    answered = [request for request in again if request.status == 200 and not request.cut]
    resends = [asdict(request) for request in again]
    if completed_by_proxy and returncode == 0:
        return {"outcome": "recovered by the proxy", "detail": f"completed in the agent's open stream ({len(again)} request(s) from the proxy)",
                "resends": resends, "resent_as": None}
    if answered and returncode == 0:
        first = answered[0]
        how = RESUMED if first.messages > cut.messages else STREAMED if first.stream else NOT_STREAMED
        what = ("it sent the partial answer back with a request to resume" if how == RESUMED
                else f"it sent the request again ({how})")
        return {"outcome": "recovered by the agent", "detail": f"{what}, {len(again)} request(s)", "resends": resends, "resent_as": how}
    if returncode == 0 and reply:
        return {"outcome": "lost", "detail": f"exit 0 with an answer of {len(reply)} characters, nothing sent again: the cut answer taken as whole",
                "resends": resends, "resent_as": None}
    return {"outcome": "lost", "detail": f"exit {returncode}, nothing answered again", "resends": resends, "resent_as": None}


def run_one(agent_key: str, binary: Path, form: CutForm, recovery: str, engine_url: str, work: Path, log_dir: Path) -> dict[str, Any]:
    """One turn of the agent, its stream cut; again with the next prompt while the reply ends before the cut."""
    for prompt in PROMPTS:
        with contextlib.ExitStack() as stack:
            relay = stack.enter_context(cut_relay(engine_url, Cut(form.after_content_events, min_request_bytes=TURN_REQUEST_BYTES)))
            port = free_port()
            options = {"upstream_model": SERVED_MODEL, "max_tokens_cap": MAX_OUTPUT_TOKENS, "answer_engine_failures": form.error_event,
                       "stream_recovery": recovery}
            command = mitmdump_command(["addons/strip_billing.py"], relay.url, port, options)
            proxy = stack.enter_context(running(f"proxy-{agent_key}-{form.key}-{recovery}", command, port=port, log_dir=log_dir, env=UNBUFFERED))
            talk = conversation(agent_key, binary, work / f"{agent_key}-{form.key}-{recovery}", proxy.url, SERVED_MODEL, MAX_OUTPUT_TOKENS,
                                timeout=TURN_TIMEOUT_S)
            try:
                turn = talk.turn(prompt)
                timed_out = False
            except subprocess.TimeoutExpired as error:
                turn, timed_out = TurnResult(-1, "", str(error.stdout or "")[-2000:], f"no answer within {TURN_TIMEOUT_S:.0f} s"), True
            found = outcome(relay, turn.returncode, turn.reply, RECOVERED_NOTE in proxy.log_text())
        # A reply the cut missed, or a turn past the time limit (Codex asks again for an answer that hit the output
        # cap: greedy replies of the tiny model can run to it), says nothing of the cut: the next prompt is asked.
        if found["outcome"] != "not cut" and not timed_out:
            break
    return {"agent": agent_key, "name": AGENTS[agent_key].name, "protocol": AGENTS[agent_key].protocol, "form": form.key, "recovery": recovery,
            "prompt": prompt, "returncode": turn.returncode, "reply_chars": len(turn.reply), "reply_tail": turn.reply[-160:],
            "stderr_tail": turn.stderr[-400:], "requests": [asdict(request) for request in relay.api_requests()], **found}


def markdown(result: dict[str, Any]) -> str:
    forms = [form for form in FORMS.values() if any(row["form"] == form.key for row in result["runs"])]
    lines = ["# What each agent does when its stream is cut (`python -m stable_prefix.bench.probes.agent_cuts`)", "",
             f"{result['generated_at']}, commit {result['commit']}; {result['machine']}; model `{result['model']}`; "
             f"each agent's CLI as a user runs it (its own retries), one turn, the first streamed answer cut by `bench/clients/cut_relay.py`.", ""]
    for recovery in result["recovery"]:
        lines += [f"## The proxy's `stream_recovery={recovery}`", "",
                  "| agent | " + " | ".join(form.title for form in forms) + " |", "|---|" + "---|" * len(forms)]
        for agent in result["agents"]:
            cells = []
            for form in forms:
                row = next((r for r in result["runs"] if r["agent"] == agent and r["form"] == form.key and r["recovery"] == recovery), None)
                cells.append("-" if row is None else f"**{row['outcome']}**: {row['detail']}; exit {row['returncode']}")
            lines.append(f"| {AGENTS[agent].name} | " + " | ".join(cells) + " |")
        if recovery != "off":
            lines.append("\n(The proxy completes chat completion streams only; Claude Code's and Codex's are as with `off`.)")
        lines.append("")
    return "\n".join(lines)


def commit() -> str | None:
    from stable_prefix.bench.team import commit as team_commit

    return team_commit()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stable_prefix.bench.probes.agent_cuts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", default=",".join(AGENTS), help="comma-separated (default all: %(default)s)")
    parser.add_argument("--forms", default=",".join(FORMS), help="comma-separated (default all: %(default)s)")
    parser.add_argument("--recovery", default="off", help=f"the proxy's stream_recovery values to run, comma-separated ({', '.join(RECOVERY_VALUES)})")
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--merge", action="store_true", help="keep the runs already in OUT/latest.json; those run again replace theirs")
    args = parser.parse_args(argv)
    agents, forms, recoveries = args.agents.split(","), [FORMS[key] for key in args.forms.split(",")], args.recovery.split(",")
    binaries = {key: AGENTS[key].install() for key in agents}
    result: dict[str, Any] = {"generated_at": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"), "commit": commit(),
                              "machine": cpu_description(), "model": str(args.model.relative_to(REPO_ROOT) if args.model.is_relative_to(REPO_ROOT) else args.model),
                              "agents": agents, "recovery": recoveries, "runs": []}
    if args.merge and (args.out / "latest.json").exists():
        earlier = json.loads((args.out / "latest.json").read_text())
        rerun = {(agent, form.key, recovery) for agent in agents for form in forms for recovery in recoveries}
        result.update(agents=earlier["agents"], recovery=earlier["recovery"], generated_at=f"{earlier['generated_at']} ({result['generated_at']}: "
                      f"{', '.join(f'{a} {f} {r}' for a, f, r in sorted(rerun))} run again)",
                      runs=[run for run in earlier["runs"] if (run["agent"], run["form"], run["recovery"]) not in rerun])
    with stop_servers_on_sigterm(), tempfile.TemporaryDirectory(prefix="stable-prefix-agent-cuts-") as temporary:
        work, logs = Path(temporary) / "work", Path(temporary) / "logs"
        port = free_port()
        command = [str(VENV_BIN / "python"), "-m", "stable_prefix.engine_patch", "serve", str(args.model), "--host", "127.0.0.1",
                   "--port", str(port), "--served-model-name", SERVED_MODEL, "--no-disk-cache", "--default-temperature", "0"]
        with running("engine", command, port=port, log_dir=logs, env={**UNBUFFERED, "HOME": temporary},
                     ready=lambda: http_ok(f"http://127.0.0.1:{port}/v1/models")) as engine:
            for recovery in recoveries:
                # The proxy completes chat completion streams only: for the other agents every value runs as `off`.
                for agent in [key for key in agents if recovery == "off" or AGENTS[key].protocol == "openai"]:
                    for form in forms:
                        row = run_one(agent, binaries[agent], form, recovery, engine.url, work, logs)
                        print(f"{row['name']:<22} {form.key:<28} recovery={recovery:<8} {row['outcome']}: {row['detail']} (exit {row['returncode']})", flush=True)
                        result["runs"].append(row)
                        args.out.mkdir(parents=True, exist_ok=True)
                        (args.out / "latest.json").write_text(json.dumps(result, indent=1) + "\n")
                        (args.out / "latest.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
