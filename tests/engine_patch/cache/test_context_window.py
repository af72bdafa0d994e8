"""The context check every engine seam calls: a prompt longer than the model's context is refused before its
prefill, in each protocol's own error shape (context_window.py, admission.py), without a server."""

from types import SimpleNamespace

import pytest

from stable_prefix.engine_patch.cache.context_window import PromptTooLong, check_prompt_fits, context_length, estimated_tokens_if_far_too_long
from stable_prefix.engine_patch.http_api.admission import error_response


def model_with(**arguments):
    return SimpleNamespace(args=SimpleNamespace(**arguments))


def test_the_context_is_the_model_s_max_position_embeddings():
    assert context_length(model_with(max_position_embeddings=131072)) == 131072


def test_a_multimodal_model_s_context_comes_from_its_text_config():
    assert context_length(model_with(text_config={"max_position_embeddings": 262144})) == 262144


def test_a_set_tokenizer_limit_caps_the_model_s_but_hugging_face_s_unset_placeholder_does_not():
    model = model_with(max_position_embeddings=32768)
    assert context_length(model, SimpleNamespace(model_max_length=8192)) == 8192
    assert context_length(model, SimpleNamespace(model_max_length=int(1e30))) == 32768
    assert context_length(model, SimpleNamespace(_tokenizer=SimpleNamespace(model_max_length=4096))) == 4096


def test_a_model_that_declares_no_context_refuses_nothing():
    assert context_length(SimpleNamespace()) is None
    check_prompt_fits(10**9, None)


def test_a_prompt_of_exactly_the_context_fits_and_one_token_more_does_not():
    check_prompt_fits(131072, 131072)
    with pytest.raises(PromptTooLong, match=r"^prompt is too long: 131073 tokens > 131072 maximum$"):
        check_prompt_fits(131073, 131072)


def test_anthropic_clients_get_an_invalid_request_error_with_anthropic_s_wording():
    status, body = error_response("/v1/messages", PromptTooLong(2_100_000, 131072))
    assert status == 400
    assert body == {"type": "error", "error": {"type": "invalid_request_error",
                                               "message": "prompt is too long: 2100000 tokens > 131072 maximum"}}


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/responses"])
def test_openai_clients_get_context_length_exceeded(path):
    status, body = error_response(path, PromptTooLong(9000, 8192))
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    assert body["error"]["type"] == "invalid_request_error"
    assert "maximum context length is 8192 tokens" in body["error"]["message"] and "9000 tokens" in body["error"]["message"]


# --- a paste far beyond the context: refused before it is tokenized whole ---------------------------------

class CountingTokenizer:
    """The tiny test model's real tokenizer, counting the characters it was given."""

    def __init__(self):
        from transformers import AutoTokenizer

        from tests.support.models import TEST_MODEL, require_model

        self.tokenizer = AutoTokenizer.from_pretrained(require_model(TEST_MODEL))
        self.characters = 0

    def encode(self, text, **kwargs):
        self.characters += len(text)
        return self.tokenizer.encode(text, **kwargs)


def paste(lines: int) -> str:
    return "".join(f"def handler_{line:06d}(request):\n    return service(request, {line % 997:03d})\n" for line in range(lines))


@pytest.fixture(scope="module")
def tokenizer():
    return CountingTokenizer()


def test_a_paste_far_beyond_the_context_is_estimated_from_a_part_of_it_within_a_percent(tokenizer):
    text = paste(40_000)  # ~2 MB, ~800K tokens
    exact = len(tokenizer.tokenizer.encode(text))
    tokenizer.characters = 0
    estimate = estimated_tokens_if_far_too_long(tokenizer, text, context_tokens=8192)
    assert estimate is not None and abs(estimate - exact) / exact < 0.01
    assert tokenizer.characters < len(text) / 10  # it read a part


def test_a_text_no_longer_than_a_few_characters_per_context_token_is_left_to_the_exact_count(tokenizer):
    tokenizer.characters = 0
    assert estimated_tokens_if_far_too_long(tokenizer, paste(500), context_tokens=8192) is None
    assert tokenizer.characters == 0


def test_a_long_text_of_few_tokens_is_not_refused_by_the_estimate(tokenizer):
    spaces = " " * 200_000  # long runs of spaces tokenize into few tokens: the exact count decides
    assert estimated_tokens_if_far_too_long(tokenizer, spaces, context_tokens=8192) is None
