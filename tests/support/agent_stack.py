"""The stack an agent CLI talks to in the end-to-end tests, on 127.0.0.1.

    CLI -> mitmdump (strip_billing + capture: our proxy)
        -> mitmdump (tests/support/upstream_recorder.py: the engine's door, what really arrived;
                     tests/support/scripted_tool_use.py too when the test scripts tool calls)
        -> python -m stable_prefix.engine_patch serve MODEL (the patched engine)

Shared by the Claude Code, claude-code-router, opencode, Qwen Code, Codex CLI
and Responses API tests, which differ in the path the client speaks and the
model they serve.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.engines import SHIPPED_DEFAULT_MODE
from tests.support.processes import VENV_BIN, Server, free_port, http_ok, mitmdump_command, running


@dataclass
class Stack:
    engine: Server
    proxy: Server
    door_record: Path
    captures_dir: Path
    api_path: str  # the path the CLI's requests take: /v1/messages or /v1/chat/completions
    script_path: Path | None = None  # the door's scripted tool uses, when it has them
    ca_cert: Path | None = None  # a forward proxy's CA certificate (for the client's NODE_EXTRA_CA_CERTS)
    # Where the current test's requests start (`new_window`), for a stack several tests share.
    arrived_before: int = 0
    captured_before: int = 0

    def new_window(self) -> None:
        """From here on `arrived()` and `captures()` hold only the requests that come after."""
        self.arrived_before, self.captured_before = self.arrived_before + len(self.arrived()), self.captured_before + len(self.captures())

    def script(self, steps: list[dict]) -> None:
        """Tool calls for the door to put in place of the engine's next answers (what is left of an earlier script goes)."""
        assert self.script_path is not None, "this stack's door scripts no tool calls (running_stack's script=None)"
        self.script_path.write_text(json.dumps(steps))

    def cache_stats(self) -> dict:
        with urllib.request.urlopen(f"{self.engine.url}/v1/cache/stats", timeout=10) as response:
            return json.load(response)

    def reused_after_each_turn(self, prompts: list[str], run_turn: Callable[[int, str], None]) -> list[int]:
        """Runs a conversation's turns in order, `run_turn(index, prompt)` each (index 0 starts it, the rest continue
        it); the engine's tokens_reused after each turn (`assert_reuse_grows_with_every_turn`)."""
        reused = []
        for index, prompt in enumerate(prompts):
            run_turn(index, prompt)
            reused.append(self.cache_stats()["tokens_reused"])
        return reused

    def arrived(self) -> list[dict]:
        """Every finished exchange on `api_path`, as the engine's door saw it."""
        if not self.door_record.exists():
            return []
        # The recorder may be writing right now: only newline-terminated lines are complete.
        complete_lines = self.door_record.read_text().split("\n")[:-1]
        records = [json.loads(line) for line in complete_lines if line.strip()]
        return [record for record in records if record["path"].split("?")[0] == self.api_path][self.arrived_before:]

    def captures(self) -> list[dict]:
        """The proxy's capture records (`addons/capture.py`), oldest first."""
        paths = sorted(self.captures_dir.glob("*/[0-9][0-9][0-9][0-9]-*.json"))
        return sorted((json.loads(path.read_text()) for path in paths), key=lambda record: record["seq"])[self.captured_before:]

    def wait_until_quiet(self, quiet_s: float = 3.0, timeout: float = 600.0) -> None:
        """Until the proxy's captures and the engine's door agree and nothing new arrived for `quiet_s`
        (both write their records as a stream ends, maybe after the CLI exits); a request the proxy
        answered itself never reaches the door."""
        deadline, last, changed = time.monotonic() + timeout, None, time.monotonic()
        while time.monotonic() < deadline:
            counts = (len(self.arrived()), sum(not capture.get("answered_by_proxy") for capture in self.captures()))
            if counts != last:
                last, changed = counts, time.monotonic()
            elif counts[0] == counts[1] and time.monotonic() - changed >= quiet_s:
                return
            time.sleep(0.5)
        raise TimeoutError(f"requests still in flight after {timeout:.0f}s (engine door, captures): {last}")


def assert_reuse_grows_with_every_turn(reused_after_each_turn: list[int]) -> None:
    """Every continued turn reused some of its prompt from the engine's cache, as the engine counts it."""
    assert all(later > earlier for earlier, later in zip(reused_after_each_turn, reused_after_each_turn[1:])), (
        f"tokens_reused must grow with every warm turn: {reused_after_each_turn}")


@contextlib.contextmanager
def shipped_engine(tmp_path: Path, model: Path, served_model: str) -> Iterator[Server]:
    """vllm-mlx as shipped in the stack's engine mode, with no prefix cache (`engines.SHIPPED_DEFAULT_MODE`), the
    same model under the same name: what a greedy answer must be whatever the cache reused."""
    port = free_port()
    command = [str(VENV_BIN / "python"), "-m", "stable_prefix.engine_patch", "serve", str(model), "--host", "127.0.0.1",
               "--port", str(port), "--served-model-name", served_model, *SHIPPED_DEFAULT_MODE]
    with running("shipped", command, port=port, log_dir=tmp_path, ready=lambda: http_ok(f"http://127.0.0.1:{port}/v1/models")) as engine:
        yield engine


@contextlib.contextmanager
def running_stack(
    tmp_path: Path, model: Path, served_model: str, answer_tokens: int, api_path: str, script: list[dict] | None = None,
    engine_flags: tuple[str, ...] = (),
    forward_proxy: bool = False,
) -> Iterator[Stack]:
    """Engine, door and proxy; `script`: tool calls the door puts in place of the engine's answers;
    `engine_flags`: more vllm-mlx flags (e.g. a default temperature for clients that send none);
    `forward_proxy`: the proxy is a forward proxy (`--mode regular`, its own CA in the stack's folder)
    that sends requests for Anthropic's hosts to the door (`anthropic_engine`)."""
    if not (model / "config.json").exists():
        pytest.fail(f"{model} is missing; run `make tiny-model` first", pytrace=False)
    tmp_path.mkdir(parents=True, exist_ok=True)
    logs, door_record, captures_dir = tmp_path / "logs", tmp_path / "arrived-at-engine.jsonl", tmp_path / "captures"
    engine_port, door_port, proxy_port = free_port(), free_port(), free_port()
    engine_command = [
        str(VENV_BIN / "python"), "-m", "stable_prefix.engine_patch", "serve", str(model),
        "--host", "127.0.0.1", "--port", str(engine_port),
        "--served-model-name", served_model, "--max-tokens", str(answer_tokens), *engine_flags,
    ]
    door_scripts, door_options = ["tests/support/upstream_recorder.py"], {"record_path": door_record}
    if script is not None:
        (tmp_path / "script.json").write_text(json.dumps(script))
        door_scripts.append("tests/support/scripted_tool_use.py")
        door_options["scripted_tool_uses"] = tmp_path / "script.json"
    door_command = mitmdump_command(door_scripts, f"http://127.0.0.1:{engine_port}", door_port, door_options)
    proxy_options = {"upstream_model": served_model, "max_tokens_cap": answer_tokens, "capture_dir": captures_dir}
    confdir = tmp_path / "mitmproxy"
    if forward_proxy:
        proxy_options |= {"anthropic_engine": f"http://127.0.0.1:{door_port}", "confdir": confdir}
    proxy_command = mitmdump_command(["addons/strip_billing.py", "addons/capture.py"], f"http://127.0.0.1:{door_port}", proxy_port, proxy_options,
                                     mode="regular" if forward_proxy else None)
    with (
        running("engine", engine_command, port=engine_port, log_dir=logs, ready=lambda: http_ok(f"http://127.0.0.1:{engine_port}/v1/models")) as engine,
        running("door", door_command, port=door_port, log_dir=logs),
        running("proxy", proxy_command, port=proxy_port, log_dir=logs) as proxy,
    ):
        yield Stack(engine, proxy, door_record, captures_dir, api_path, door_options.get("scripted_tool_uses"),
                    confdir / "mitmproxy-ca-cert.pem" if forward_proxy else None)
