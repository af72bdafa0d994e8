"""mlx-lm's streaming detokenizer, built once per tokenizer instead of once per generation."""

import pytest
from mlx_lm.tokenizer_utils import NaiveStreamingDetokenizer, TokenizerWrapper
from mlx_lm.utils import load_tokenizer

from stable_prefix.engine_patch.vllm_mlx import detokenizer_map
from tests.support.models import require_model

TEXTS = ["Hello wörld, naïve café — 你好\n  two spaces, then a tab\tend.", "def f(x):\n    return x  # ok?", " leading space"]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(require_model())


def as_shipped(monkeypatch):
    """mlx-lm's own getter for this test, whatever an earlier test in this process installed; put back afterwards."""
    getter = TokenizerWrapper.__dict__["detokenizer"]
    shipped = getattr(getter.fget, "__wrapped__", None)
    monkeypatch.setattr(TokenizerWrapper, "detokenizer", getter if shipped is None else property(shipped, doc=getter.__doc__))


@pytest.fixture
def patched(monkeypatch):
    """Installs the patch for one test on mlx-lm's own getter."""
    as_shipped(monkeypatch)
    assert detokenizer_map.install() == ["mlx-lm detokenizer (token map built once per tokenizer)"]


def detokenize(tokenizer, token_ids):
    detokenizer = tokenizer.detokenizer
    for token in token_ids:
        detokenizer.add_token(token)
    detokenizer.finalize()
    return detokenizer.text


def test_text_is_what_mlx_lms_own_detokenizer_produces(tokenizer, monkeypatch):
    as_shipped(monkeypatch)
    expected = [detokenize(tokenizer, tokenizer.encode(text)) for text in TEXTS]
    detokenizer_map.install()
    assert [detokenize(tokenizer, tokenizer.encode(text)) for text in TEXTS] == expected
    assert expected[0] == TEXTS[0]


def test_the_vocabulary_is_read_once_per_tokenizer_not_once_per_generation(patched, monkeypatch):
    tokenizer = load_tokenizer(require_model())  # one no detokenizer was built for yet
    reads = []
    get_vocab = tokenizer._tokenizer.get_vocab
    monkeypatch.setattr(tokenizer._tokenizer, "get_vocab", lambda *args, **kwargs: reads.append(1) or get_vocab(*args, **kwargs))
    for text in TEXTS * 3:
        detokenize(tokenizer, tokenizer.encode(text))
    assert 0 < len(reads) <= 2  # mlx-lm's BPE detokenizer reads `vocab` twice while it is built


def test_each_generation_gets_its_own_state(tokenizer, patched):
    first, second = tokenizer.detokenizer, tokenizer.detokenizer
    assert first is not second
    for token in tokenizer.encode("one two"):
        first.add_token(token)
    assert second.tokens == [] and second.text == ""
    assert first.tokenmap is second.tokenmap  # the shared, read-only part


def test_a_tokenizer_whose_vocabulary_grew_gets_a_new_token_map(tokenizer, patched, monkeypatch):
    before = tokenizer.detokenizer.tokenmap
    monkeypatch.setattr(detokenizer_map, "_vocabulary_size", lambda wrapper: -1)
    assert tokenizer.detokenizer.tokenmap is not before


def test_installing_twice_patches_once(patched):
    assert detokenizer_map.install() == []


def test_a_tokenizer_with_the_naive_detokenizer_gets_a_new_one_per_generation(patched):
    # mlx-lm picks the naive detokenizer when a tokenizer's decoder is neither
    # BPE nor SPM; it has no token map to share and cannot be copied.
    tokenizer = TokenizerWrapper(load_tokenizer(require_model())._tokenizer, NaiveStreamingDetokenizer)
    first, second = tokenizer.detokenizer, tokenizer.detokenizer
    assert isinstance(first, NaiveStreamingDetokenizer) and first is not second
    assert detokenize(tokenizer, tokenizer.encode(TEXTS[1])) == TEXTS[1]
