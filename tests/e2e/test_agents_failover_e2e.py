"""Every agent's real CLI, through a team's setup, loses no turn when the replica answering it dies mid-reply.

The setup is the one a team runs (docs/scale-out.md), on 127.0.0.1:

    agent CLI (Claude Code, opencode, Qwen Code, Pi, Codex: its own retry settings, as `stable-prefix AGENT` runs it)
      -> stable-prefix up --upstream ROUTER      (our proxy, the team options)
      -> stable-prefix router haproxy            (the key on a consistent-hash ring, L7 retries)
      -> stable-prefix serve build/tiny-model-failover --prefix-cache-dir SHARED   (two replicas, one shared directory)

Each test: a first turn, then a continued turn during whose streamed reply the replica that served the
first is SIGKILLed (once it has decoded `KILL_AFTER_TOKENS` tokens of it, read from its `/v1/status`). The
turn must complete (the CLI exits 0 with an answer), the survivor must serve it warm (its first request
after the kill restores at least the whole first turn's prompt from the shared directory), and no
request of the turn may be answered twice. Claude Code and Codex send the request again themselves, after
the proxy's error event; opencode, Qwen Code and Pi get the stream completed by the proxy
(`addons/stream_recovery.py`). The killed replica is started again (same port, same directory) for the
next test. Replicas default to greedy decoding (`--default-temperature 0`) for agents that send no
temperature.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from stable_prefix.addons.stream_recovery import RECOVERED_NOTE
from stable_prefix.bench.clients.cli_agents import AGENTS, conversation
from stable_prefix.bench.team import Replica
from tests.support.models import FAILOVER_MODEL, require_model
from tests.support.processes import VENV_BIN, free_port, http_ok, running

pytestmark = [pytest.mark.server, pytest.mark.slow]

SERVED_MODEL = "tiny-failover"
MAX_OUTPUT_TOKENS = 512
KILL_AFTER_TOKENS = 8
# The main turn's prompt, told from a side request (a title, Qwen Code's memory request) by its size.
MAIN_PROMPT_TOKENS = 1000
_PLANNED = re.compile(r"prefix cache (?:HIT|MISS): (\d+) prompt tokens, (\d+) reused")


@dataclass
class Team:
    replicas: list[Replica]
    router_url: str
    proxy_url: str
    proxy_log_dir: Path

    def proxy_log(self) -> str:
        return "\n".join(path.read_text(errors="replace") for path in sorted(self.proxy_log_dir.glob("*/logs/proxy-*.log")))

    def planned(self, replica: Replica, since: int = 0) -> list[tuple[int, int]]:
        """(prompt tokens, reused) of each request the replica's current life planned, from byte `since` of its log."""
        text = replica.lives[-1].log_path.read_bytes()[since:].decode(errors="replace")
        return [(int(m.group(1)), int(m.group(2))) for m in _PLANNED.finditer(text)]


def replica_command(port: int, shared: Path) -> list[str]:
    return [str(VENV_BIN / "stable-prefix"), "serve", str(require_model(FAILOVER_MODEL)), "--host", "127.0.0.1", "--port", str(port),
            "--served-model-name", SERVED_MODEL, "--prefix-cache-dir", str(shared), "--default-temperature", "0"]


@pytest.fixture(scope="module")
def team(tmp_path_factory):
    root = tmp_path_factory.mktemp("team")
    shared, logs = root / "shared-kv", root / "logs"
    with contextlib.ExitStack() as stack:
        replicas = []
        for letter in "ab":
            port = free_port()
            home = root / f"home-{letter}"
            home.mkdir()
            # The suite keeps servers' snapshots in RAM (conftest); a team's replicas share them on disk.
            replicas.append(Replica(f"replica-{letter}", port, replica_command(port, shared),
                                    {"HOME": str(home), "ENGINE_PATCH_NO_DISK_CACHE": "0"}, logs, stack))
        for replica in replicas:
            replica.start()
        router_port, proxy_port = free_port(), free_port()
        router = [str(VENV_BIN / "stable-prefix"), "router", "haproxy", *(f"--replica={r.url}" for r in replicas), "--port", str(router_port),
                  "--log-dir", str(logs / "router")]
        stack.enter_context(running("router", router, port=router_port, log_dir=logs, ready=lambda: http_ok(f"http://127.0.0.1:{router_port}/health")))
        up = [str(VENV_BIN / "stable-prefix"), "up", "--upstream", f"http://127.0.0.1:{router_port}", "--served-model-name", SERVED_MODEL,
              "--port", str(proxy_port), "--max-tokens", str(MAX_OUTPUT_TOKENS), "--capture-dir", str(root / "proxy")]
        stack.enter_context(running("up", up, port=proxy_port, log_dir=logs, env={"XDG_STATE_HOME": str(root / "state")},
                                    ready=lambda: http_ok(f"http://127.0.0.1:{proxy_port}/v1/models")))
        yield Team(replicas, f"http://127.0.0.1:{router_port}", f"http://127.0.0.1:{proxy_port}", root / "proxy")


def running_main_request(replica: Replica) -> dict | None:
    with contextlib.suppress(requests.RequestException, ValueError):
        for request in requests.get(f"{replica.url}/v1/status", timeout=2).json().get("requests") or []:
            if request.get("phase") == "generation" and request.get("prompt_tokens", 0) >= MAIN_PROMPT_TOKENS:
                return request
    return None


@dataclass
class Kill:
    replica: Replica | None = None
    decoded_tokens: int = 0
    of_tokens: int = 0
    at: float = 0.0
    log_offsets: dict | None = None


@contextlib.contextmanager
def kill_mid_reply(team: Team) -> Kill:
    """While the block runs: SIGKILL whichever replica is decoding the main turn, once it has decoded
    KILL_AFTER_TOKENS of its reply."""
    kill, stop = Kill(), threading.Event()

    def watch() -> None:
        while not stop.is_set():
            for replica in team.replicas:
                request = running_main_request(replica)
                if request and request.get("completion_tokens", 0) >= KILL_AFTER_TOKENS:
                    kill.log_offsets = {r.name: r.lives[-1].log_path.stat().st_size for r in team.replicas}
                    replica.kill()
                    kill.replica, kill.at = replica, time.monotonic()
                    kill.decoded_tokens, kill.of_tokens = request["completion_tokens"], request.get("max_tokens", 0)
                    return
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, name="killer", daemon=True)
    watcher.start()
    try:
        yield kill
    finally:
        stop.set()
        watcher.join(timeout=10)


def restart(replica: Replica) -> None:
    """The killed replica back (same port, same directory); HAProxy checks it every second and takes it back
    after one passed check."""
    replica.start()
    time.sleep(3)


def served_first_turn(team: Team, offsets: dict[str, int]) -> tuple[Replica, int]:
    """The replica that planned the first turn's main request, and its prompt tokens."""
    for replica in team.replicas:
        main = [planned for planned in team.planned(replica, offsets[replica.name]) if planned[0] >= MAIN_PROMPT_TOKENS]
        if main:
            return replica, main[0][0]
    raise AssertionError("no replica planned the first turn")


@pytest.mark.parametrize("agent", list(AGENTS))
def test_a_replica_killed_mid_reply_costs_the_agent_no_turn_and_the_survivor_serves_it_warm(team, agent, tmp_path):
    binary = AGENTS[agent].install()
    talk = conversation(agent, binary, tmp_path / agent, team.proxy_url, SERVED_MODEL, MAX_OUTPUT_TOKENS)
    offsets = {replica.name: replica.lives[-1].log_path.stat().st_size for replica in team.replicas}
    first = talk.turn("Explain what this project does.")
    assert first.returncode == 0, f"the first turn failed:\n{first.stdout[-2000:]}\n{first.stderr[-2000:]}"
    holder, first_prompt = served_first_turn(team, offsets)
    wait_for_disk_writes(holder)

    proxy_log_before = len(team.proxy_log())
    with kill_mid_reply(team) as kill:
        second = talk.turn("Now say more about how it does it.")
    proxy_log = team.proxy_log()[proxy_log_before:]
    try:
        assert kill.replica is not None, "the reply ended before its replica could be killed"
        survivor = next(replica for replica in team.replicas if replica is not kill.replica)
        after_kill = [planned for planned in team.planned(survivor, kill.log_offsets[survivor.name]) if planned[0] >= MAIN_PROMPT_TOKENS]
        print(f"\n{AGENTS[agent].name}: killed {kill.replica.name} after {kill.decoded_tokens} decoded tokens; the turn exited "
              f"{second.returncode} with {len(second.reply)} characters; the survivor's requests since (prompt, reused): {after_kill}; "
              f"proxy: {'completed the stream' if RECOVERED_NOTE in proxy_log else 'error event, the agent sent again'}")
        assert second.returncode == 0 and second.reply, f"the turn was lost:\n{second.stdout[-2000:]}\n{second.stderr[-2000:]}"
        assert after_kill, "the survivor served nothing of the turn"
        prompt, reused = after_kill[0]
        assert reused >= first_prompt, f"the survivor reused {reused} of {prompt} tokens, less than the first turn's {first_prompt}: not warm"
        if AGENTS[agent].protocol == "openai":
            assert RECOVERED_NOTE in proxy_log, "the proxy did not complete the chat completion stream"
        else:
            assert "broke off its answer" in proxy_log and RECOVERED_NOTE not in proxy_log
    finally:
        if kill.replica is not None:
            restart(kill.replica)


def wait_for_disk_writes(replica: Replica, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        stats = requests.get(f"{replica.url}/v1/cache/stats", timeout=10).json()
        if stats["disk_writes"] >= 1 and not stats["disk_writes_pending"]:
            return
        assert time.monotonic() < deadline, f"the first turn's snapshot is not on disk: {stats}"
        time.sleep(0.2)
