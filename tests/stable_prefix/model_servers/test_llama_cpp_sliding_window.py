"""llama.cpp with a sliding-window model (Gemma 3 270M, Q4_K_M, real weights): what a slot restored from its file keeps,
and how `up --server llama.cpp` keeps such a model's lanes warm without slot files.

Measured with b11434: a slot restored from its file is prefilled again from its first token, although the file holds
the whole prefix (the restore loses the checkpoints a windowed layer needs to reuse a prefix: llama.cpp #25913,
#28194); llama.cpp's RAM prompt cache keeps them. So for such a model the proxy pins lanes to slots and leaves moving
them to that cache (`llama_slot_files=false`, model_servers/llama_cpp.py). The restore test below fails the day a
restore keeps them: the slot files can then be turned on for these models too.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from stable_prefix.model_servers.llama_cpp import GgufModel, llama_server_binary
from tests.fixtures import claude_code as fixtures
from tests.support.launcher import Launcher, start_launcher, stop_launcher
from tests.support.processes import LOOPBACK, REPO_ROOT, free_port, http_ok, running

GEMMA3 = REPO_ROOT / "build" / "gemma3-270m" / "gemma-3-270m-q4_k_m.gguf"
SLOTS = 2
SLOT_CONTEXT = 4096
MIN_MAIN_LANE_REUSE = 0.95

pytestmark = [
    pytest.mark.server,
    pytest.mark.slow,  # Gemma 3 prefills ~20 tokens/s on a busy 2-core CPU
    pytest.mark.skipif(not Path(llama_server_binary()).is_file(), reason="no llama-server (make llama-server, or set LLAMA_SERVER)"),
    pytest.mark.skipif(not GEMMA3.is_file(), reason=f"no {GEMMA3.name} (make llama-models)"),
]


def prompt_tokens(usage: dict) -> int:
    return usage["input_tokens"] + usage["cache_read_input_tokens"]


def post(url: str, body: dict, headers: dict | None = None) -> dict:
    response = requests.post(url, json={**body, "stream": False}, headers=headers or {}, timeout=300)
    response.raise_for_status()
    return response.json()


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Launcher]:
    root = tmp_path_factory.mktemp("gemma3-stack")
    with pytest.MonkeyPatch.context() as environment:
        environment.setenv("XDG_CACHE_HOME", str(root / "cache"))
        launcher = start_launcher(root, "--server", "llama.cpp", "--slots", str(SLOTS), "--slot-context", str(SLOT_CONTEXT), model=GEMMA3)
    try:
        launcher.wait_until_ready()
        yield launcher
    finally:
        stop_launcher(launcher)


def test_gemma3_is_read_as_a_model_whose_restored_slots_are_not_reused():
    assert GgufModel.read(GEMMA3).restored_slots_reused is False


def test_on_gemma3_the_main_lane_comes_back_warm_after_a_subagent_and_a_title(stack, capsys):
    url = stack.url + "/v1/messages"
    main = post(url, fixtures.main_request(3))["usage"]
    post(url, fixtures.subagent_request("explore"), fixtures.agent_headers("6b6b6b6b6b6b6b6b"))
    post(url, fixtures.title_request())
    main_again = post(url, fixtures.main_request(4))["usage"]
    with capsys.disabled():
        print(f"\nGemma 3, 2 slots, lanes pinned, moved by llama.cpp's RAM cache: main {main}, main again {main_again}")
    assert main_again["cache_read_input_tokens"] >= MIN_MAIN_LANE_REUSE * prompt_tokens(main), main_again


def test_on_gemma3_a_slot_restored_from_its_file_is_prefilled_again(tmp_path, capsys):
    """Against llama-server alone: the same prompt's continuation on the slot that computed it reuses it; on a slot
    restored from that slot's file it is prefilled from the start."""
    port = free_port()
    (tmp_path / "slots").mkdir()
    command = [llama_server_binary(), "--model", str(GEMMA3), "--host", LOOPBACK, "--port", str(port), "--parallel", "2", "--kv-unified",
               "--ctx-size", str(2 * SLOT_CONTEXT), "--slot-save-path", str(tmp_path / "slots"), "--no-cache-idle-slots", "--cache-ram", "0"]
    with running("llama-server", command, port=port, log_dir=tmp_path, ready=lambda: http_ok(f"http://{LOOPBACK}:{port}/health"),
                 startup_timeout=180) as server:
        chat = server.url + "/v1/chat/completions"
        post(chat, {**fixtures.openai_request(2), "max_tokens": 4, "id_slot": 0})
        saved = post(server.url + "/slots/0?action=save", {"filename": "lane.bin"})
        restored = post(server.url + "/slots/1?action=restore", {"filename": "lane.bin"})
        on_restored = post(chat, {**fixtures.openai_request(3), "max_tokens": 4, "id_slot": 1})["timings"]
        on_computed = post(chat, {**fixtures.openai_request(3), "max_tokens": 4, "id_slot": 0})["timings"]
    with capsys.disabled():
        print(f"\nGemma 3: {saved['n_saved']} tokens saved, {restored['n_restored']} restored; the next turn reused "
              f"{on_restored['cache_n']} of them on the restored slot, {on_computed['cache_n']} on the slot that computed them")
    assert restored["n_restored"] == saved["n_saved"] > 0
    assert on_computed["cache_n"] > 0
    assert on_restored["cache_n"] == 0
