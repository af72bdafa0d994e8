"""A model's identity is its content: the same files anywhere are the same model,
and any changed byte, tokenizer or chat template makes another one."""

import json
import os
import shutil

import pytest
from mlx_lm.utils import load_model

from stable_prefix.engine_patch.disk.model_identity import DigestMemo, identity_of, loaded_model_description
from tests.support.models import OTHER_SEED_MODEL, TEST_MODEL, require_model


@pytest.fixture(scope="module")
def description():
    model, _ = load_model(require_model(TEST_MODEL))
    return loaded_model_description(model)


@pytest.fixture
def model_copy(tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(require_model(TEST_MODEL), copy)
    return copy


def identity(model_dir, description, memo_dir):
    return identity_of(model_dir, DigestMemo(memo_dir / "file-digests.json"), description)


def test_the_same_files_at_another_path_are_the_same_model(model_copy, description, tmp_path):
    assert identity(model_copy, description, tmp_path).key == identity(TEST_MODEL, description, tmp_path).key


def test_a_model_with_other_weights_is_another_model(description, tmp_path):
    other, _ = load_model(require_model(OTHER_SEED_MODEL))
    assert identity(OTHER_SEED_MODEL, loaded_model_description(other), tmp_path).key != identity(TEST_MODEL, description, tmp_path).key


def test_one_changed_weight_byte_is_noticed_even_with_size_and_mtime_put_back(model_copy, description, tmp_path):
    before = identity(model_copy, description, tmp_path).key
    weights = model_copy / "model.safetensors"
    status = weights.stat()
    with open(weights, "r+b") as file:
        file.seek(status.st_size - 3)
        byte = file.read(1)
        file.seek(status.st_size - 3)
        file.write(bytes([byte[0] ^ 0x01]))
    os.utime(weights, ns=(status.st_atime_ns, status.st_mtime_ns))
    assert weights.stat().st_size == status.st_size and weights.stat().st_mtime_ns == status.st_mtime_ns
    assert identity(model_copy, description, tmp_path).key != before


@pytest.mark.parametrize("file_name, change", [
    ("tokenizer_config.json", lambda config: {**config, "chat_template": config["chat_template"] + " "}),
    ("config.json", lambda config: {**config, "rope_theta": config.get("rope_theta", 10000.0) * 2}),
])
def test_a_changed_chat_template_or_config_is_another_model(model_copy, description, tmp_path, file_name, change):
    before = identity(model_copy, description, tmp_path).key
    path = model_copy / file_name
    path.write_text(json.dumps(change(json.loads(path.read_text()))))
    assert identity(model_copy, description, tmp_path).key != before


def test_a_different_cache_layout_or_version_is_another_identity(description, tmp_path):
    base = identity(TEST_MODEL, description, tmp_path).key
    assert identity(TEST_MODEL, {**description, "parameter_dtypes": ["bfloat16"]}, tmp_path).key != base
    assert identity(TEST_MODEL, {**description, "cache_layers": ["RotatingKVCache"] * 2}, tmp_path).key != base


def test_a_restart_hashes_no_file_whose_stat_is_unchanged(model_copy, description, tmp_path):
    first = DigestMemo(tmp_path / "file-digests.json")
    key = identity_of(model_copy, first, description).key
    first.save()
    again = DigestMemo(tmp_path / "file-digests.json")
    assert identity_of(model_copy, again, description).key == key
    assert first.hashed_files == len(list(model_copy.iterdir())) and again.hashed_files == 0


def test_a_folder_without_weights_has_no_identity(tmp_path, description):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="no model"):
        identity(tmp_path, description, tmp_path)
