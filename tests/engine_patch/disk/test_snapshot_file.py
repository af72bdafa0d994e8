"""The disk tier's file format on its own: what goes in comes back bit for bit, and every kind of
damage is refused before any of it is trusted (a KV block, a lane's manifest)."""

import json
import struct

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import ArraysCache, KVCache

from stable_prefix.engine_patch.cache.cache_layers import copy_block, layers_from_arrays, layers_to_arrays
from stable_prefix.engine_patch.cache.kv_blocks import Block
from stable_prefix.engine_patch.disk.persisted_entry import block_arrays
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


def block_of(tokens: int, dtype=mx.float16) -> Block:
    arrays, nbytes = copy_block(kv_layers(tokens, dtype), 0, tokens)
    mx.eval([part for pair in arrays for part in pair])
    return Block("b" * 32, 0, tokens, np.arange(tokens, dtype=np.int32), arrays, nbytes)


def saved_block(path, block: Block, identity=IDENTITY):
    arrays, metadata = block_arrays(block)
    prepared = prepare_snapshot("block", identity, {name: host_view(a) for name, a in arrays.items()}, {**metadata, "note": "40"})
    write_snapshot(path, prepared)
    return prepared


def saved_lane(path, identity=IDENTITY):
    prepared = prepare_snapshot("lane", identity, {}, {"lane": json.dumps({"blocks": [["b" * 32, 0, 40, 40]]}), "note": "40"})
    write_snapshot(path, prepared)
    return prepared


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16, mx.float32])
def test_a_block_comes_back_bit_for_bit(tmp_path, dtype):
    block = block_of(300, dtype)
    prepared = saved_block(tmp_path / "b.kvblock", block)
    header = read_header(tmp_path / "b.kvblock", IDENTITY, "block")
    assert header.file_bytes == prepared.file_bytes == (tmp_path / "b.kvblock").stat().st_size
    assert header.tokens.tolist() == list(range(300))  # read with the header, before any KV byte
    back = load_arrays(tmp_path / "b.kvblock", header)
    for index, pair in enumerate(block.arrays):
        for name, original in zip(("keys", "values"), pair):
            loaded = back[f"layer.{index}.{name}"]
            assert loaded.dtype == dtype and mx.array_equal(original, loaded).item()


def test_layers_with_empty_slots_and_meta_state_keep_their_shape():
    recurrent = ArraysCache(size=2)
    recurrent[0] = mx.ones((1, 3))
    arrays, metadata = layers_to_arrays([recurrent])
    (back,) = layers_from_arrays(arrays, metadata)
    assert isinstance(back, ArraysCache) and back.cache[1] is None and mx.array_equal(back.cache[0], recurrent.cache[0]).item()


def test_the_file_is_private_to_its_user(tmp_path):
    saved_block(tmp_path / "b.kvblock", block_of(10))
    assert (tmp_path / "b.kvblock").stat().st_mode & 0o777 == 0o600


def test_a_manifest_is_a_header_alone(tmp_path):
    prepared = saved_lane(tmp_path / "l.kv")
    header = read_header(tmp_path / "l.kv", IDENTITY, "lane")
    assert header.tensors == {} and header.tokens is None and prepared.file_bytes == len(prepared.header)


def truncated(data: bytes) -> bytes:
    return data[: len(data) - 100]


def grown(data: bytes) -> bytes:
    return data + b"\0" * 64


def garbled_header(data: bytes) -> bytes:
    return data[:8] + b"{not json" + data[17:]


def flipped_data_byte(data: bytes) -> bytes:
    """A KV byte of a block, a header byte of a manifest."""
    position = len(data) - 10
    return data[:position] + bytes([data[position] ^ 0xFF]) + data[position + 1 :]


def empty(data: bytes) -> bytes:
    return b""


def huge_header_length(data: bytes) -> bytes:
    return struct.pack("<Q", 2**40) + data[8:]


def with_version(data: bytes, version: str) -> bytes:
    (header_length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_length])
    header["__metadata__"]["format_version"] = version
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    return struct.pack("<Q", len(encoded)) + encoded + data[8 + header_length :]


def newer_format(data: bytes) -> bytes:
    return with_version(data, "99")


def older_format(data: bytes) -> bytes:
    """A file of format version 2 (a whole lane per file) is foreign, never misread."""
    return with_version(data, "2")


def edited_header_value(data: bytes) -> bytes:
    """Still a well-formed header, one value changed (a block's range would be one): only its checksum tells."""
    (header_length,) = struct.unpack("<Q", data[:8])
    header = data[8 : 8 + header_length].replace(b'"note":"40"', b'"note":"39"')
    assert header != data[8 : 8 + header_length]
    return data[:8] + header + data[8 + header_length :]


DAMAGE = [truncated, grown, garbled_header, flipped_data_byte, empty, huge_header_length, newer_format, older_format, edited_header_value]


@pytest.mark.parametrize("damage", DAMAGE, ids=[d.__name__ for d in DAMAGE])
def test_a_damaged_block_is_refused(tmp_path, damage):
    saved_block(tmp_path / "b.kvblock", block_of(40))
    (tmp_path / "b.kvblock").write_bytes(damage((tmp_path / "b.kvblock").read_bytes()))
    with pytest.raises(SnapshotFileError):
        load_arrays(tmp_path / "b.kvblock", read_header(tmp_path / "b.kvblock", IDENTITY, "block"))


@pytest.mark.parametrize("damage", DAMAGE, ids=[d.__name__ for d in DAMAGE])
def test_a_damaged_manifest_is_refused(tmp_path, damage):
    saved_lane(tmp_path / "l.kv")
    (tmp_path / "l.kv").write_bytes(damage((tmp_path / "l.kv").read_bytes()))
    with pytest.raises(SnapshotFileError):
        read_header(tmp_path / "l.kv", IDENTITY, "lane")


def test_a_file_written_for_another_model_is_refused(tmp_path):
    saved_block(tmp_path / "b.kvblock", block_of(40), identity="b" * 64)
    with pytest.raises(SnapshotFileError, match="another model identity"):
        read_header(tmp_path / "b.kvblock", IDENTITY, "block")


def test_a_file_of_another_kind_is_refused(tmp_path):
    saved_block(tmp_path / "b.kvblock", block_of(40))
    with pytest.raises(SnapshotFileError, match="a 'block' file where a lane file belongs"):
        read_header(tmp_path / "b.kvblock", IDENTITY, "lane")


def test_an_existing_file_is_never_overwritten(tmp_path):
    saved_block(tmp_path / "b.kvblock", block_of(10))
    with pytest.raises(FileExistsError):
        saved_block(tmp_path / "b.kvblock", block_of(10))

