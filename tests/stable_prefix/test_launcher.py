"""`stable-prefix up`, and `stable-prefix claude|opencode|qwen|codex|pi` against it, run as a user runs them: real processes, real signals.

The launcher is started as a subprocess with the test's tiny model; the tests
read what it prints, send requests through it, and check which processes are
left afterwards (by the process groups the state file names, and the ports).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import requests

from stable_prefix.agents import claude_code
from stable_prefix.engine_patch.install import DEFAULT_ENGINE, ENGINES
from stable_prefix.live import LogFollower, live_line
from tests.fixtures import claude_code as fixtures
from tests.support.launcher import ANSWER_TOKENS, READY_TIMEOUT_S, Launcher, group_alive, start_launcher, stop_launcher
from tests.support.llm_client import cache_stats, send
from tests.support.processes import LOOPBACK, VENV_BIN, free_port, port_open

LIVE_LINE = re.compile(r"^#(\d+) (\S+) · ([\d,]+) prompt tok · ([\d,]+) reused · TTFT (\d+\.\d+) s · (.*)$")


@pytest.fixture
def launched(tmp_path: Path) -> Iterator[Callable[..., Launcher]]:
    """Starts launchers; each is stopped at the end, with no process left whatever the test did."""
    started: list[Launcher] = []

    def launch(*arguments: str, model: Path | None = None) -> Launcher:
        started.append(start_launcher(tmp_path, *arguments, model=model))
        return started[-1]

    try:
        yield launch
    finally:
        for launcher in started:
            stop_launcher(launcher)


def main_turn(topic: str, turns: int = 2) -> dict:
    """A Claude Code-shaped main-agent request; more turns on one topic continue the same conversation."""
    return fixtures.main_request(turns, topic=topic)


# --- a running stack: requests, live lines, mitmweb ---------------------------------------------------


@pytest.fixture(scope="module")
def web_stack(tmp_path_factory) -> Iterator[tuple[Launcher, dict]]:
    launcher = start_launcher(tmp_path_factory.mktemp("web-stack"), "--web", "--web-port", str(free_port()))
    try:
        yield launcher, launcher.wait_until_ready()
    finally:
        stop_launcher(launcher)


@pytest.mark.server
def test_up_says_how_to_start_every_agent_and_what_a_claude_code_router_3_user_sets(web_stack):
    launcher, state = web_stack
    for command in AGENT_COMMANDS:
        launcher.wait_for(rf"^    stable-prefix {command} --port {launcher.port}$", timeout=5)
    launcher.wait_for(rf"Providers: type anthropic_messages, base URL {re.escape(launcher.url)}, any API key, model '{state['model']}'", timeout=5)
    launcher.wait_for(r"CLAUDE_CODE_MAX_OUTPUT_TOKENS=\d+ ccr <profile>", timeout=5)


def test_a_request_through_the_stack_gets_a_live_line(web_stack):
    launcher, _ = web_stack
    lines_before = len(launcher.stdout)
    send(launcher.url, "/v1/messages", main_turn("the parser", turns=2))
    warm = send(launcher.url, "/v1/messages", main_turn("the parser", turns=3))
    assert warm.usage["cache_read_input_tokens"] > 0
    deadline = time.monotonic() + 30
    while len(new_lines := [line.strip() for line in launcher.stdout[lines_before:] if line.startswith("#")]) < 2:
        assert time.monotonic() < deadline, f"no live lines for the two requests: {launcher.stdout[lines_before:]}"
        time.sleep(0.2)
    fields = [LIVE_LINE.match(line) for line in new_lines]
    assert all(fields), f"not live lines: {new_lines}"
    assert [field[2] for field in fields] == ["main", "main"]
    assert int(fields[1][3].replace(",", "")) == warm.usage["input_tokens"] + warm.usage["cache_read_input_tokens"]
    assert int(fields[1][4].replace(",", "")) == warm.usage["cache_read_input_tokens"]
    assert fields[1][6].startswith("prefix stable")


@pytest.mark.server
def test_mitmweb_shows_each_diagnosis_in_the_flow_comment_and_marks_a_broken_prefix(web_stack):
    launcher, state = web_stack
    send(launcher.url, "/v1/messages", main_turn("the build"))
    send(launcher.url, "/v1/messages", main_turn("the tests"))  # same lane, another first message: the prefix broke
    token = state["web_url"].split("token=")[1]
    web_root = state["web_url"].split("?")[0].rstrip("/")
    assert requests.get(f"{web_root}/flows", timeout=10).status_code == 403, "mitmweb's flow API must need its token"
    authorized = {"Authorization": f"Bearer {token}"}
    columns = requests.get(f"{web_root}/options", headers=authorized, timeout=10).json()["web_columns"]["value"]
    assert "comment" in columns, f"the flow list must show the comment column: {columns}"
    flows = requests.get(f"{web_root}/flows", headers=authorized, timeout=10).json()
    messages = [flow for flow in flows if flow["request"]["path"].startswith("/v1/messages")]
    assert messages, f"no /v1/messages flow in mitmweb: {[flow['request']['path'] for flow in flows]}"
    for flow in messages:
        assert flow["comment"].startswith("lane "), f"no diagnosis in the comment: {flow['comment']!r}"
    broken = [flow for flow in messages if "prefix broke" in flow["comment"]]
    assert broken and all(flow["marked"] for flow in broken), [(flow["comment"], flow["marked"]) for flow in messages]
    assert not any(flow["marked"] for flow in messages if flow not in broken)


@pytest.mark.server
def test_with_no_capture_nothing_is_recorded_and_the_live_line_is_the_proxys_diagnosis(launched, tmp_path):
    launcher = launched("--no-capture")
    assert launcher.wait_until_ready()["captures"] is None
    launcher.wait_for(r"captures  off \(--no-capture\)")
    send(launcher.url, "/v1/messages", main_turn("no records"))
    launcher.wait_for(r"^lane main · first request · [\d,]+ B", timeout=30)
    assert not list((tmp_path / "captures").rglob("*.json"))


# --- stopping, and refusing to start ------------------------------------------------------------------


@pytest.mark.server
def test_ctrl_c_stops_both_servers_and_leaves_no_process(launched):
    launcher = launched()
    state = launcher.wait_until_ready()
    engine_port = int(state["engine_url"].rsplit(":", 1)[1])
    launcher.process.send_signal(signal.SIGINT)
    assert launcher.exit_status() == 130
    assert "stopped the engine and the proxy" in "".join(launcher.stderr)
    assert not group_alive(state["engine_pid"]) and not group_alive(state["proxy_pid"])
    assert not port_open(launcher.port) and not port_open(engine_port)
    assert not launcher.state_path.exists(), "the state file must go with the stack"


@pytest.mark.server
def test_a_crashed_engine_stops_the_proxy_and_names_the_cause(launched):
    launcher = launched()
    state = launcher.wait_until_ready()
    os.killpg(state["engine_pid"], signal.SIGKILL)
    assert launcher.exit_status() == 1
    launcher.wait_for(r"the engine was killed by signal SIGKILL; stopping the proxy\. Last lines of .*engine-\d+\.log", stream="stderr")
    assert not group_alive(state["proxy_pid"]) and not port_open(launcher.port)


@pytest.mark.server
def test_a_port_in_use_is_refused_before_anything_starts(launched):
    with socket.socket() as occupant:
        occupant.bind((LOOPBACK, 0))
        occupant.listen()
        busy_port = occupant.getsockname()[1]
        engine_port = free_port()
        launcher = launched("--engine-port", str(engine_port), "--web", "--web-port", str(busy_port))
        assert launcher.exit_status(timeout=60) == 2
    stderr = "".join(launcher.stderr)
    assert f"port {busy_port} on 127.0.0.1 is already in use, so the web UI cannot listen there" in stderr
    assert "--web-port N" in stderr and "Nothing was started" in stderr
    assert "starting the engine" not in "".join(launcher.stdout)
    assert not port_open(engine_port) and not port_open(launcher.port)


@pytest.mark.server
def test_an_engine_that_cannot_start_is_a_clear_error_with_nothing_left_running(launched, tmp_path):
    broken_model = tmp_path / "broken-model"
    broken_model.mkdir()
    (broken_model / "config.json").write_text('{"model_type": "no-such-architecture"}')
    engine_port = free_port()
    launcher = launched("--engine-port", str(engine_port), model=broken_model)
    assert launcher.exit_status(timeout=READY_TIMEOUT_S) == 1
    stderr = "".join(launcher.stderr)
    assert re.search(r"the engine exited with code \d+ before it was ready\. Last lines of its log:\n", stderr), stderr
    assert f"No safetensors found in {broken_model}" in stderr, "the log lines must show why"
    assert stderr.rstrip().endswith("Nothing is left running.")
    assert "starting the proxy" not in "".join(launcher.stdout)
    assert not port_open(engine_port) and not port_open(launcher.port)
    assert not [process.pid for process in psutil.process_iter(["cmdline"])
                if str(broken_model) in " ".join(process.info["cmdline"] or [])]


@pytest.mark.server
def test_up_runs_the_default_engine_mode_and_the_one_it_is_told(web_stack, launched):
    launcher, state = web_stack
    assert cache_stats(state["engine_url"])["engine"] == DEFAULT_ENGINE
    other = next(engine for engine in ENGINES if engine != DEFAULT_ENGINE)
    told = launched("--engine", other)
    told_state = told.wait_until_ready()
    told.wait_for(rf"engine .*\({other} engine; cache stats")
    assert cache_stats(told_state["engine_url"])["engine"] == other


def test_a_model_folder_that_does_not_exist_is_refused_before_anything_starts(tmp_path):
    result = subprocess.run([str(VENV_BIN / "stable-prefix"), "up", str(tmp_path / "no-such-model")],
                            capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 2
    assert f"{tmp_path / 'no-such-model'}: no such model folder" in result.stderr
    assert result.stdout == ""


def test_engine_flags_the_launcher_owns_are_refused(tmp_path):
    result = subprocess.run([str(VENV_BIN / "stable-prefix"), "up", "model", "--", "--host", "0.0.0.0"],
                            capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 2
    assert "--host: set by `stable-prefix up` itself (the vllm-mlx server listens on 127.0.0.1)" in result.stderr


# --- the live line ------------------------------------------------------------------------------------


def test_a_live_line_shows_an_unknown_figure_as_unknown_never_as_zero():
    record = {"seq": 4, "lane": "main", "diagnosis": {"line": "lane main · first request · 402 B"},
              "response": {"status": 200, "usage": {"output_tokens": 3}, "ttft_s": None}}
    assert live_line(record) == "#4 main · ? prompt tok · ? reused · TTFT ? · first request · 402 B"


def test_a_live_line_reads_openai_usage_and_names_a_failed_request():
    record = {"seq": 9, "lane": "sub:1a2b3c", "diagnosis": None,
              "response": {"status": 400, "ttft_s": 0.25,
                           "usage": {"prompt_tokens": 1200, "prompt_tokens_details": {"cached_tokens": 1100}}}}
    assert live_line(record) == "#9 sub:1a2b3c · HTTP 400 · 1,200 prompt tok · 1,100 reused · TTFT 0.25 s"


# --- stable-prefix claude (and every agent's command without a stack) ------------------------------------


AGENT_COMMANDS = ["claude", "opencode", "qwen", "codex", "pi"]


@pytest.mark.parametrize("command", AGENT_COMMANDS)
def test_an_agent_without_a_running_stack_says_how_to_start_one(command, tmp_path):
    result = subprocess.run([str(VENV_BIN / "stable-prefix"), command, "--port", "18123", "hi"], capture_output=True,
                            text=True, env={**os.environ, "XDG_STATE_HOME": str(tmp_path)})
    assert result.returncode == 2
    assert f"stable-prefix {command}: no stack is running on port 18123" in result.stderr
    assert "stable-prefix up MODEL --port 18123" in result.stderr


# Each agent's command with one of the two help flags (both work for every command: one launcher reads them).
@pytest.mark.parametrize(("command", "flag"), list(zip(AGENT_COMMANDS, ["--help", "-h", "--help", "-h", "--help"], strict=True)))
def test_an_agents_help_says_what_the_command_does_with_no_stack_running(command, flag, tmp_path):
    result = subprocess.run([str(VENV_BIN / "stable-prefix"), command, flag], capture_output=True, text=True,
                            env={**os.environ, "XDG_STATE_HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: stable-prefix {command} [--port N]")
    assert "Reads where the stack is from the state file `stable-prefix up` writes" in result.stdout
    assert "no stack is running" not in result.stdout + result.stderr


def user_config(root: Path) -> dict[str, str]:
    """A user's Claude Code set-up that has never seen our token: onboarding done, no key approved."""
    home, config_dir, workdir = root / "home", root / "claude-config", root / "project"
    for folder in (home, config_dir, workdir):
        folder.mkdir(parents=True, exist_ok=True)
    (config_dir / ".claude.json").write_text(json.dumps({
        "hasCompletedOnboarding": True, "lastOnboardingVersion": claude_code.CLI_VERSION, "theme": "dark",
        "projects": {str(workdir.resolve()): {"hasTrustDialogAccepted": True, "hasCompletedProjectOnboarding": True}},
    }))
    return {"HOME": str(home), "CLAUDE_CONFIG_DIR": str(config_dir), "PWD": str(workdir)}


@pytest.mark.server
@pytest.mark.slow
def test_claude_runs_claude_code_against_the_stack_with_the_served_model_and_the_cap(web_stack, claude_binary, tmp_path):
    launcher, state = web_stack
    user = user_config(tmp_path)
    environment = {"PATH": os.environ["PATH"], "HOME": user["HOME"], "CLAUDE_CONFIG_DIR": user["CLAUDE_CONFIG_DIR"],
                   "XDG_STATE_HOME": str(launcher.state_home), "ANTHROPIC_API_KEY": "sk-ant-the-users-own-key",
                   "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    captures = Path(state["captures"])
    earlier = set(captures.glob("*.json"))  # other tests' requests to the same stack
    result = subprocess.run([str(VENV_BIN / "stable-prefix"), "claude", "--port", str(launcher.port), "--claude", str(claude_binary),
                             "-p", "Say hello."], capture_output=True, text=True, env=environment, cwd=user["PWD"],
                            timeout=600, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, f"stable-prefix claude failed:\n{result.stdout}\n{result.stderr}"
    deadline = time.monotonic() + 15  # the proxy writes a record as the answer ends, maybe after claude exited
    while not (new_paths := sorted(set(captures.glob("*.json")) - earlier)) and time.monotonic() < deadline:
        time.sleep(0.2)
    from_claude = [json.loads(path.read_text()) for path in new_paths]
    assert from_claude, "no request of Claude Code reached the proxy"
    for record in from_claude:
        assert record["client_body"]["model"] == state["model"], "Claude Code was not told the served model's name"
        assert record["forwarded_body"]["max_tokens"] <= ANSWER_TOKENS
        assert "authorization" in record["request"]["headers"], "the local token goes as Authorization: Bearer"
        assert "x-api-key" not in record["request"]["headers"], "the user's own API key must not be sent"
        assert record["request"]["headers"].get("x-claude-code-request-class") == "main", "Claude Code was not asked for its hint headers"
        assert record["response"]["status"] == 200


@pytest.mark.server
@pytest.mark.slow
def test_claude_starts_without_a_key_prompt(web_stack, claude_binary, tmp_path):
    """The interactive UI, with a config that never approved a key: it must open at the input prompt."""
    launcher, _ = web_stack
    user = user_config(tmp_path)
    session = claude_code.InteractiveSession(tmux=claude_code.shutil.which("tmux") or "tmux", socket=f"launcher-{os.getpid()}")
    command = ["env", "-i", f"PATH={os.environ['PATH']}", "TERM=xterm-256color", "LANG=C.UTF-8",
               f"HOME={user['HOME']}", f"CLAUDE_CONFIG_DIR={user['CLAUDE_CONFIG_DIR']}",
               f"XDG_STATE_HOME={launcher.state_home}", "ANTHROPIC_API_KEY=sk-ant-the-users-own-key",
               "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
               str(VENV_BIN / "stable-prefix"), "claude", "--port", str(launcher.port), "--claude", str(claude_binary)]
    session.tmux_command("new-session", "-d", "-s", "claude", "-x", "160", "-y", "50", "-c", user["PWD"], *command)
    try:
        session.wait_until_ready(timeout=90)  # raises on any first-run dialog, the key prompt included
    finally:
        session.close()


def test_the_log_follower_gives_each_diagnosis_line_once_and_waits_for_a_line_being_written(tmp_path):
    log = tmp_path / "proxy.log"
    log.write_text("[10:00:00.001] Loading script addons/strip_billing.py\n[10:00:01.002] lane main · first request · 1,234 B\n"
                   "[10:00:02.003] lane main · prefix stable 1,2")
    follower = LogFollower(log)
    assert follower.new_lines() == ["lane main · first request · 1,234 B"]
    with log.open("a") as more:
        more.write("34/1,300 B (95.0%) · first change messages[2]\n")
    assert follower.new_lines() == ["lane main · prefix stable 1,234/1,300 B (95.0%) · first change messages[2]"]
    assert follower.new_lines() == []


# --- stable-prefix opencode, stable-prefix qwen --------------------------------------------------------


def requests_of_a_launch(web_stack, arguments: list[str], environment: dict[str, str], cwd: Path) -> list[dict]:
    """Run `stable-prefix COMMAND --port P …` against the stack as a user would; the capture records of
    what it sent, once the proxy has written them (as each answer ends)."""
    launcher, state = web_stack
    captures = Path(state["captures"])
    earlier = set(captures.glob("*.json"))
    command, *rest = arguments
    result = subprocess.run([str(VENV_BIN / "stable-prefix"), command, "--port", str(launcher.port), *rest], capture_output=True,
                            text=True, env=environment, cwd=cwd, timeout=600, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, f"stable-prefix {command} failed:\n{result.stdout}\n{result.stderr}"
    deadline = time.monotonic() + 30
    while not set(captures.glob("*.json")) - earlier and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)  # a side request of the same run may still be finishing
    return [json.loads(path.read_text()) for path in sorted(set(captures.glob("*.json")) - earlier)]


def users_environment(launcher: Launcher, home: Path, **more: str) -> dict[str, str]:
    """What an agent command runs with: the user's own home, and the stack's state home, where it finds the stack."""
    return {"PATH": os.environ["PATH"], "HOME": str(home), "XDG_STATE_HOME": str(launcher.state_home), **more}


def assert_each_request_names_the_served_model_within_the_cap(records: list[dict], state: dict, agent: str) -> None:
    """What every `stable-prefix AGENT` launch owes the stack, whatever the agent's own settings say."""
    for record in records:
        assert record["client_body"]["model"] == state["model"], f"{agent} was not told the served model's name"
        assert record["client_body"]["max_tokens"] <= ANSWER_TOKENS, f"{agent} asks for more than the stack gives"


@pytest.mark.server
@pytest.mark.slow
def test_opencode_runs_against_the_stack_with_the_served_model_whatever_the_users_config(web_stack, opencode_binary, tmp_path):
    launcher, state = web_stack
    home, project = tmp_path / "home", tmp_path / "project"
    (home / ".config" / "opencode").mkdir(parents=True)
    project.mkdir()
    (home / ".config" / "opencode" / "opencode.json").write_text(json.dumps({"model": "some-cloud/big-model"}))
    from_opencode = requests_of_a_launch(web_stack, ["opencode", "--opencode", str(opencode_binary), "run", "Say hello."],
                                         users_environment(launcher, home), project)
    assert from_opencode, "no request of opencode reached the proxy"
    assert_each_request_names_the_served_model_within_the_cap(from_opencode, state, "opencode")
    for record in from_opencode:
        assert record["request"]["headers"]["user-agent"].startswith("opencode/")
        assert record["response"]["status"] == 200
    # opencode itself adds a "$schema" key to it; the user's settings stay.
    assert json.loads((home / ".config" / "opencode" / "opencode.json").read_text())["model"] == "some-cloud/big-model"


@pytest.mark.server
@pytest.mark.slow
def test_qwen_runs_against_the_stack_with_the_served_model_and_its_settings_written_for_it(web_stack, qwen_cli, tmp_path):
    launcher, state = web_stack
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    environment = users_environment(launcher, home, OPENAI_API_KEY="sk-the-users-own-key", OPENAI_BASE_URL="https://api.example.invalid/v1")
    from_qwen = requests_of_a_launch(web_stack, ["qwen", "--qwen", str(qwen_cli), "Say hello."], environment, project)
    assert from_qwen, "no request of Qwen Code reached the proxy (not the user's OPENAI_BASE_URL)"
    assert_each_request_names_the_served_model_within_the_cap(from_qwen, state, "Qwen Code")
    for record in from_qwen:
        assert record["request"]["headers"]["user-agent"].startswith("QwenCode/")
    settings = launcher.state_path.with_name(f"qwen-settings-{launcher.port}.json")
    assert json.loads(settings.read_text())["privacy"] == {"usageStatisticsEnabled": False}
    assert settings.stat().st_mode & 0o777 == 0o600, "Qwen Code rewrote the settings (an older format version?)"


@pytest.mark.server
@pytest.mark.slow
def test_pi_runs_against_the_stack_with_the_served_model_and_leaves_the_users_pi_folder_as_it_was(web_stack, pi_cli, tmp_path):
    launcher, state = web_stack
    home, project = tmp_path / "home", tmp_path / "project"
    agent_folder = home / ".pi" / "agent"
    agent_folder.mkdir(parents=True)
    project.mkdir()
    users_own = {"models.json": json.dumps({"providers": {"my-cloud": {"baseUrl": "https://api.example.invalid/v1", "api": "openai-completions",
                                                                      "apiKey": "MY_KEY", "models": [{"id": "big-model"}]}}}),
                 "settings.json": json.dumps({"defaultProvider": "my-cloud", "defaultModel": "big-model"})}
    for name, text in users_own.items():
        (agent_folder / name).write_text(text)
    from_pi = requests_of_a_launch(web_stack, ["pi", "--pi", str(pi_cli), "-p", "Say hello."], users_environment(launcher, home), project)
    assert from_pi, "no request of Pi reached the proxy (not the user's default provider)"
    assert_each_request_names_the_served_model_within_the_cap(from_pi, state, "Pi")
    for record in from_pi:
        assert record["request"]["headers"]["session_id"], "the provider did not turn on Pi's session header"
        assert record["response"]["status"] == 200
    assert {name: (agent_folder / name).read_text() for name in users_own} == users_own
    extension = launcher.state_path.with_name(f"pi-provider-{launcher.port}.js")
    assert extension.stat().st_mode & 0o777 == 0o600
