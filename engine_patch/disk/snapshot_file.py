"""One file of the disk tier: a checked safetensors file (a lane's manifest, a KV block, a positional state).

Every file is a plain safetensors file (mlx, numpy and the `safetensors`
package read it): an 8-byte header length, a JSON header naming each tensor's
dtype, shape and byte range, then the data. The header's `__metadata__` says
what the file is (format, version, kind, the model identity it belongs to),
what the disk tier needs to use it (`persisted_entry.py`), a CRC-32 per tensor
and one of the header itself (positions and offsets live there). A lane's
manifest has one tensor, its token ids, so the index reads a header and a few
KB of token ids, never KV bytes.

Version 3 keeps a lane as a manifest naming its blocks and states, each block
and state a file of its own written once; version 2 held a whole lane per file
and version 1 an end state alone: both are refused as foreign (and removed at
start, `snapshot_directory.py`).

Writing runs on the disk tier's writer thread and never calls MLX (so it cannot
race the generation thread inside MLX: `mx.save_safetensors` is not an option
there): the generation thread hands it numpy views of evaluated arrays
(`host_view`, zero copy), and the writer streams their bytes. Reading runs on
the generation thread: `read_header` checks everything that can be checked
without the data (format, kind, identity, sizes and offsets against the file's
length, the token ids), and `load_arrays` loads through `mx.load` and checks
every tensor's CRC before any of it is trusted (`load_unchecked` hands the check
to a thread, so that a lane's load reads its next file while one is checked).
"""

from __future__ import annotations

import functools
import json
import os
import struct
import zlib
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

FORMAT = "stable-prefix-kv"
FORMAT_VERSION = 3
KINDS = ("lane", "block", "state")
TOKENS = "tokens"
HEADER_CRC = "header_crc32"
# A header is a few KB (a name, dtype, shape and offsets per tensor); anything
# far larger is not one of ours.
MAX_HEADER_BYTES = 16 * 2**20
CHECKSUM_THREADS = min(8, os.cpu_count() or 1)

# safetensors dtype names, their mlx dtypes, and the numpy dtype whose bytes
# stand in for them on the host (numpy has no bfloat16: its bits travel as uint16).
DTYPES: dict[str, tuple[mx.Dtype, np.dtype]] = {
    "BOOL": (mx.bool_, np.dtype(np.bool_)),
    "U8": (mx.uint8, np.dtype(np.uint8)),
    "U16": (mx.uint16, np.dtype(np.uint16)),
    "U32": (mx.uint32, np.dtype(np.uint32)),
    "U64": (mx.uint64, np.dtype(np.uint64)),
    "I8": (mx.int8, np.dtype(np.int8)),
    "I16": (mx.int16, np.dtype(np.int16)),
    "I32": (mx.int32, np.dtype(np.int32)),
    "I64": (mx.int64, np.dtype(np.int64)),
    "F16": (mx.float16, np.dtype(np.float16)),
    "BF16": (mx.bfloat16, np.dtype(np.uint16)),
    "F32": (mx.float32, np.dtype(np.float32)),
}
DTYPE_NAMES = {mlx_dtype: name for name, (mlx_dtype, _) in DTYPES.items()}


class SnapshotFileError(Exception):
    """A file that is not a complete, intact file of ours; the message says why."""


@dataclass(frozen=True)
class HostArray:
    """An array's bytes as the writer thread sees them: a numpy view, no MLX."""

    dtype_name: str
    data: np.ndarray

    @property
    def nbytes(self) -> int:
        return self.data.nbytes


def host_view(array: mx.array) -> HostArray:
    """A zero-copy numpy view of an evaluated mlx array (call on the thread that owns MLX).

    The view keeps the mlx array alive; snapshot arrays are never written to
    again, so the writer may read it on another thread.
    """
    name = DTYPE_NAMES.get(array.dtype)
    if name is None:
        raise SnapshotFileError(f"arrays of dtype {array.dtype} cannot be saved")
    if array.dtype == mx.bfloat16:
        array = array.view(mx.uint16)
    mx.eval(array)
    return HostArray(name, np.asarray(array))


def token_array(tokens: list[int] | np.ndarray) -> HostArray:
    return HostArray("I32", np.asarray(tokens, dtype=np.int32))


@dataclass(frozen=True)
class SnapshotHeader:
    """What a file says about itself, checked against its length (and its token ids, if it has them)."""

    identity: str
    kind: str
    metadata: dict[str, str]
    tensors: dict[str, dict[str, Any]]
    file_bytes: int
    tokens: np.ndarray | None


def contiguous_blocks(array: np.ndarray) -> Iterator[np.ndarray]:
    """`array`'s bytes in row-major order, as C-contiguous pieces (no copy for a KV slice)."""
    if array.flags.c_contiguous:
        yield array
    elif array.ndim <= 1:
        yield np.ascontiguousarray(array)
    else:
        for row in array:
            yield from contiguous_blocks(row)


def checksum(array: np.ndarray) -> int:
    crc = 0
    for block in contiguous_blocks(array):
        crc = zlib.crc32(block.reshape(-1).view(np.uint8), crc)
    return crc


@dataclass(frozen=True)
class PreparedSnapshot:
    """A file's exact bytes, ready to stream: its encoded header and its arrays."""

    header: bytes
    arrays: list[np.ndarray]

    @property
    def file_bytes(self) -> int:
        return len(self.header) + sum(array.nbytes for array in self.arrays)


def prepare_snapshot(kind: str, identity: str, arrays: dict[str, HostArray], metadata: dict[str, str]) -> PreparedSnapshot:
    """Encode the header (with a CRC-32 of every array, one pass over their bytes)."""
    header: dict[str, Any] = {}
    offset = 0
    for name, array in arrays.items():
        header[name] = {"dtype": array.dtype_name, "shape": list(array.data.shape), "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    header["__metadata__"] = {
        **metadata,
        "format": FORMAT,
        "format_version": str(FORMAT_VERSION),
        "kind": kind,
        "identity": identity,
        "crc32": json.dumps({name: checksum(array.data) for name, array in arrays.items()}),
    }
    header["__metadata__"][HEADER_CRC] = str(_header_checksum(header))
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # safetensors pads the header to 8 bytes
    return PreparedSnapshot(struct.pack("<Q", len(encoded)) + encoded, [array.data for array in arrays.values()])


def write_snapshot(path: Path, prepared: PreparedSnapshot) -> None:
    """Write a new file at `path` (created 0600; it must not exist) and fsync it."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(prepared.header)
        for array in prepared.arrays:
            for block in contiguous_blocks(array):
                file.write(block.reshape(-1).view(np.uint8))
        file.flush()
        os.fsync(file.fileno())


def read_header(path: Path, identity: str, kind: str) -> SnapshotHeader:
    """The header (and token ids, if any) of the file at `path`; `SnapshotFileError` unless it is
    a complete file of this format and `kind` for `identity` (a folder name: its first digits suffice)."""
    with open(path, "rb") as file:
        file_bytes = os.fstat(file.fileno()).st_size
        header, metadata, data_start = _header_of(file, file_bytes)
        if metadata.get("format_version") != str(FORMAT_VERSION):
            raise SnapshotFileError(f"format version {metadata.get('format_version')!r}, this build reads {FORMAT_VERSION}")
        if metadata.get("kind") != kind:
            raise SnapshotFileError(f"a {metadata.get('kind')!r} file where a {kind} file belongs")
        if not isinstance(metadata.get("identity"), str) or not metadata["identity"].startswith(identity):
            raise SnapshotFileError("written for another model identity")
        for key in ("crc32", HEADER_CRC):
            if not isinstance(metadata.get(key), str):
                raise SnapshotFileError(f"metadata {key!r} is missing")
        try:
            if not isinstance(json.loads(metadata["crc32"]), dict):
                raise ValueError("not an object")
        except ValueError as error:
            raise SnapshotFileError(f"metadata is malformed ({error})") from error
        if metadata[HEADER_CRC] != str(_header_checksum(header)):
            raise SnapshotFileError("the header fails its checksum")
        header.pop("__metadata__")
        data_bytes = _check_tensors(header)
        if data_start + data_bytes != file_bytes:
            raise SnapshotFileError(f"{file_bytes} bytes, but the header describes {data_start + data_bytes}")
        tokens = None
        if TOKENS in header:
            start, end = header[TOKENS]["data_offsets"]
            file.seek(data_start + start)
            tokens = np.frombuffer(file.read(end - start), dtype=np.int32)
    if tokens is not None:
        if header[TOKENS]["dtype"] != "I32" or len(tokens) != int(np.prod(header[TOKENS]["shape"])):
            raise SnapshotFileError("the token ids are not an int32 vector")
        if checksum(tokens) != json.loads(metadata["crc32"]).get(TOKENS):
            raise SnapshotFileError("the token ids fail their checksum")
        tokens = tokens.astype(np.int64)
    return SnapshotHeader(metadata["identity"], kind, metadata, header, file_bytes, tokens)


def format_version_of(path: Path) -> str | None:
    """The format version a file of ours says it has (None: not one of our files, or unreadable)."""
    try:
        with open(path, "rb") as file:
            _, metadata, _ = _header_of(file, os.fstat(file.fileno()).st_size)
    except (OSError, SnapshotFileError):
        return None
    version = metadata.get("format_version")
    return version if isinstance(version, str) else None


def load_arrays(path: Path, header: SnapshotHeader) -> dict[str, mx.array]:
    """Every tensor but the token ids, loaded and checked against its CRC."""
    arrays, checked = load_unchecked(path, header)
    checked.result()
    return arrays


def load_unchecked(path: Path, header: SnapshotHeader) -> tuple[dict[str, mx.array], Future]:
    """Every tensor but the token ids, loaded (each byte read once, by `mx.load`), and the check of their CRCs
    running on the checksum pool: its `result()` raises `SnapshotFileError` if one fails. Nothing loaded may
    be trusted before it returns; a lane's load reads its next file meanwhile."""
    arrays = mx.load(str(path), format="safetensors")
    mx.eval(arrays)
    views = {}
    for name, described in header.tensors.items():
        array = arrays.get(name)
        if array is None or list(array.shape) != described["shape"] or DTYPE_NAMES.get(array.dtype) != described["dtype"]:
            raise SnapshotFileError(f"tensor {name!r} does not load as its header describes it")
        if name != TOKENS:  # read_header checked them
            views[name] = memoryview(array)
    arrays.pop(TOKENS, None)
    return arrays, _checksum_pool().submit(_check_checksums, views, json.loads(header.metadata["crc32"]))


def _check_checksums(views: dict[str, memoryview], crcs: dict[str, int]) -> None:
    # zlib releases the GIL: this runs beside the generation thread's next read.
    for name, view in views.items():
        if zlib.crc32(view) != crcs.get(name):
            raise SnapshotFileError(f"tensor {name!r} fails its checksum")


@functools.cache
def _checksum_pool() -> ThreadPoolExecutor:
    """One pool for every load (a lane's load reads a file per block)."""
    return ThreadPoolExecutor(max_workers=CHECKSUM_THREADS, thread_name_prefix="kv-checksum")


def _header_of(file, file_bytes: int) -> tuple[dict[str, Any], dict[str, Any], int]:
    """The parsed header of an open file, its metadata (checked to be ours) and where its data starts."""
    if file_bytes < 8:
        raise SnapshotFileError(f"{file_bytes} bytes: shorter than a header")
    (header_bytes,) = struct.unpack("<Q", file.read(8))
    if header_bytes > min(MAX_HEADER_BYTES, file_bytes - 8):
        raise SnapshotFileError(f"header length {header_bytes} does not fit a {file_bytes}-byte file")
    try:
        header = json.loads(file.read(header_bytes))
    except ValueError as error:
        raise SnapshotFileError(f"header is not JSON ({error})") from error
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        raise SnapshotFileError("not a stable-prefix KV file")
    return header, metadata, 8 + header_bytes


def _header_checksum(header: dict[str, Any]) -> int:
    """CRC-32 of the header (tensors and metadata) without its own checksum, in one canonical JSON form."""
    metadata = {key: value for key, value in header["__metadata__"].items() if key != HEADER_CRC}
    canonical = json.dumps({**header, "__metadata__": metadata}, sort_keys=True, separators=(",", ":"))
    return zlib.crc32(canonical.encode())


def _check_tensors(header: dict[str, Any]) -> int:
    """The data length the tensors cover, back to back from offset 0; raise if they do not."""
    spans = []
    for name, tensor in header.items():
        try:
            dtype = DTYPES[tensor["dtype"]][1]
            shape = [int(size) for size in tensor["shape"]]
            start, end = (int(offset) for offset in tensor["data_offsets"])
        except (KeyError, TypeError, ValueError) as error:
            raise SnapshotFileError(f"tensor {name!r} is malformed ({error!r})") from error
        if min(shape, default=0) < 0 or end - start != int(np.prod(shape)) * dtype.itemsize:
            raise SnapshotFileError(f"tensor {name!r}: {end - start} bytes for shape {shape}")
        spans.append((start, end))
    position = 0
    for start, end in sorted(spans):
        if start != position:
            raise SnapshotFileError("tensor data overlaps or leaves gaps")
        position = end
    return position
