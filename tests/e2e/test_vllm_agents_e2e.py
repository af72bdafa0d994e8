"""Real agent CLIs through `stable-prefix up --server vllm`: vLLM CPU (the tiny test model) and the proxy, as a user runs them.

One `up` for the module; each agent has a two-turn conversation in a scratch project, and the second turn's
prompt must come mostly from vLLM's prefix cache, by vLLM's own counters on /metrics (hits against prompt
tokens over the turn): the proxy kept the first turn's prefix byte-stable and vLLM found it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from stable_prefix.bench.clients.cli_agents import AGENTS, conversation
from stable_prefix.bench.servers_vllm import counters
from stable_prefix.model_servers import vllm
from tests.support.models import TEST_MODEL, require_model
from tests.support.processes import VENV_BIN, free_port, http_ok, running

pytestmark = [pytest.mark.server, pytest.mark.slow]

MAX_OUTPUT_TOKENS = 256
# The second turn's prompt is the first's and its answer, then the new question: all but that tail is cached
# (in vLLM's whole 128-token blocks).
MIN_SECOND_TURN_REUSE = 0.8
STARTUP_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class VllmStack:
    proxy_url: str
    engine_url: str
    model_name: str


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    root = tmp_path_factory.mktemp("up-vllm")
    port, engine_port = free_port(), free_port()
    model = require_model(TEST_MODEL)
    command = [str(VENV_BIN / "stable-prefix"), "up", "--server", "vllm", str(model), "--port", str(port), "--engine-port", str(engine_port),
               "--max-tokens", str(MAX_OUTPUT_TOKENS), "--capture-dir", str(root / "captures"), "--", "--kv-cache-memory-bytes", "1G"]
    # The venv as found here: `running` gives `up` a home of its own, where `make vllm`'s default venv is not.
    env = {"XDG_STATE_HOME": str(root / "state"), vllm.VENV_VARIABLE: str(vllm.vllm_venv()), "VLLM_NO_USAGE_STATS": "1"}
    with running("up", command, port=port, log_dir=root, env=env, startup_timeout=STARTUP_TIMEOUT_S,
                 ready=lambda: http_ok(f"http://127.0.0.1:{port}/v1/models")):
        yield VllmStack(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{engine_port}", model.name)


@pytest.mark.parametrize("agent", ["claude", "opencode"])
def test_a_two_turn_conversation_reuses_its_prompt_by_vllms_own_counters(stack, agent, tmp_path):
    talk = conversation(agent, AGENTS[agent].install(), tmp_path / agent, stack.proxy_url, stack.model_name, MAX_OUTPUT_TOKENS)
    first = talk.turn("Explain what this project does.")
    assert first.returncode == 0, f"the first turn failed:\n{first.stdout[-2000:]}\n{first.stderr[-2000:]}"
    before = counters(stack.engine_url)
    second = talk.turn("Now say more about how it does it.")
    after = counters(stack.engine_url)
    assert second.returncode == 0 and second.reply, f"the second turn failed:\n{second.stdout[-2000:]}\n{second.stderr[-2000:]}"
    prompt = after["prompt_tokens_total"] - before["prompt_tokens_total"]
    hits = after["prefix_cache_hits_total"] - before["prefix_cache_hits_total"]
    print(f"\n{AGENTS[agent].name} through up --server vllm: the second turn's {prompt:,.0f} prompt tokens, {hits:,.0f} from vLLM's prefix cache")
    assert prompt > 0 and hits >= MIN_SECOND_TURN_REUSE * prompt
