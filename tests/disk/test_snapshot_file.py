"""The snapshot file format on its own: what goes in comes back bit for bit, and
every kind of damage is refused before any of it is trusted."""

import json
import struct

import mlx.core as mx
import pytest
from mlx_lm.models.cache import ArraysCache, KVCache

from stable_prefix.engine_patch.cache.cache_layers import layers_from_arrays, layers_to_arrays, snapshot
from stable_prefix.engine_patch.disk.snapshot_file import (
    SnapshotFileError,
    host_view,
    load_arrays,
    prepare_snapshot,
    read_header,
    write_snapshot,
)

IDENTITY = "a" * 64


def kv_layers(tokens: int, dtype=mx.float16, layers: int = 2) -> list[KVCache]:
    """A live cache holding `tokens` positions, as a finished request leaves it."""
    cache = []
    for _ in range(layers):
        layer = KVCache()
        layer.update_and_fetch(mx.random.normal((1, 2, tokens, 8)).astype(dtype), mx.random.normal((1, 2, tokens, 8)).astype(dtype))
        cache.append(layer)
    return cache


def saved(path, layers, tokens=None, prompt_length=None, identity=IDENTITY):
    arrays, metadata = layers_to_arrays(layers)
    count = layers[0].offset
    tokens = list(range(count)) if tokens is None else tokens
    prepared = prepare_snapshot(identity, tokens, prompt_length or count, {name: host_view(a) for name, a in arrays.items()}, metadata)
    write_snapshot(path, prepared)
    return prepared


def loaded(path, identity=IDENTITY):
    header = read_header(path, identity)
    return header, layers_from_arrays(*load_arrays(path, header))


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16, mx.float32])
@pytest.mark.parametrize("tokens", [300, 500], ids=["copied-snapshot", "snapshot-sharing-a-padded-buffer"])
def test_a_snapshot_comes_back_bit_for_bit(tmp_path, dtype, tokens):
    layers, _ = snapshot(kv_layers(tokens, dtype))
    prepared = saved(tmp_path / "s.kv", layers, prompt_length=tokens - 20)
    header, back = loaded(tmp_path / "s.kv")
    assert header.file_bytes == prepared.file_bytes == (tmp_path / "s.kv").stat().st_size
    assert header.tokens.tolist() == list(range(tokens)) and header.prompt_length == tokens - 20
    for original, restored in zip(layers, back):
        assert type(restored) is KVCache and restored.offset == tokens
        for a, b in zip(original.state, restored.state):
            assert b.dtype == dtype and mx.array_equal(a, b).item()


def test_layers_with_empty_slots_and_meta_state_keep_their_shape():
    recurrent = ArraysCache(size=2)
    recurrent[0] = mx.ones((1, 3))
    arrays, metadata = layers_to_arrays([recurrent])
    (back,) = layers_from_arrays(arrays, metadata)
    assert isinstance(back, ArraysCache) and back.cache[1] is None and mx.array_equal(back.cache[0], recurrent.cache[0]).item()


def test_the_file_is_private_to_its_user(tmp_path):
    saved(tmp_path / "s.kv", kv_layers(10))
    assert (tmp_path / "s.kv").stat().st_mode & 0o777 == 0o600


def test_the_header_and_token_ids_are_read_without_the_kv_bytes(tmp_path):
    layers = kv_layers(64, layers=8)
    saved(tmp_path / "s.kv", layers)
    data = (tmp_path / "s.kv").read_bytes()
    (header_length,) = struct.unpack("<Q", data[:8])
    tokens_end = 8 + header_length + 64 * 4
    # Everything after the token ids is KV data: zero it, and the header still reads.
    (tmp_path / "s.kv").write_bytes(data[:tokens_end] + bytes(len(data) - tokens_end))
    assert read_header(tmp_path / "s.kv", IDENTITY).tokens.tolist() == list(range(64))


def truncated(data: bytes) -> bytes:
    return data[: len(data) - 100]


def grown(data: bytes) -> bytes:
    return data + b"\0" * 64


def garbled_header(data: bytes) -> bytes:
    return data[:8] + b"{not json" + data[17:]


def flipped_kv_byte(data: bytes) -> bytes:
    position = len(data) - 10
    return data[:position] + bytes([data[position] ^ 0xFF]) + data[position + 1 :]


def flipped_token_byte(data: bytes) -> bytes:
    (header_length,) = struct.unpack("<Q", data[:8])
    position = 8 + header_length + 1
    return data[:position] + bytes([data[position] ^ 0x01]) + data[position + 1 :]


def empty(data: bytes) -> bytes:
    return b""


def huge_header_length(data: bytes) -> bytes:
    return struct.pack("<Q", 2**40) + data[8:]


def newer_format(data: bytes) -> bytes:
    (header_length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_length])
    header["__metadata__"]["format_version"] = "99"
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    return struct.pack("<Q", len(encoded)) + encoded + data[8 + header_length :]


def edited_header_value(data: bytes) -> bytes:
    """Still a well-formed header, one value changed (a checkpoint position would be one): only its checksum tells."""
    (header_length,) = struct.unpack("<Q", data[:8])
    header = data[8 : 8 + header_length].replace(b'"prompt_length":"40"', b'"prompt_length":"39"')
    assert header != data[8 : 8 + header_length]
    return data[:8] + header + data[8 + header_length :]


def older_format(data: bytes) -> bytes:
    """A file of format version 1 (an end state without checkpoints) is foreign, never misread."""
    (header_length,) = struct.unpack("<Q", data[:8])
    header = data[8 : 8 + header_length].replace(b'"format_version":"2"', b'"format_version":"1"')
    assert header != data[8 : 8 + header_length]
    return data[:8] + header + data[8 + header_length :]


DAMAGE = [truncated, grown, garbled_header, flipped_kv_byte, flipped_token_byte, empty, huge_header_length, newer_format,
          edited_header_value, older_format]


@pytest.mark.parametrize("damage", DAMAGE, ids=[d.__name__ for d in DAMAGE])
def test_a_damaged_file_is_refused(tmp_path, damage):
    saved(tmp_path / "s.kv", kv_layers(40))
    (tmp_path / "s.kv").write_bytes(damage((tmp_path / "s.kv").read_bytes()))
    with pytest.raises(SnapshotFileError):
        loaded(tmp_path / "s.kv")


def test_a_file_written_for_another_model_is_refused(tmp_path):
    saved(tmp_path / "s.kv", kv_layers(40), identity="b" * 64)
    with pytest.raises(SnapshotFileError, match="another model identity"):
        read_header(tmp_path / "s.kv", IDENTITY)


def test_an_existing_file_is_never_overwritten(tmp_path):
    saved(tmp_path / "s.kv", kv_layers(10))
    with pytest.raises(FileExistsError):
        saved(tmp_path / "s.kv", kv_layers(10))

