"""llama.cpp's `llama-server` (build b11434, `make llama-server`) for `up --server llama.cpp MODEL.gguf`.

What keeps an agent's lanes warm in it (`LANE_SETTINGS`, printed by `up` and in docs/servers.md): a slot per lane
(the main agent, a subagent, a title each keep their KV), one KV pool sized for every slot full at once, idle slots
left as they are (the proxy moves lanes between slots and disk itself: addons/llama_slots.py), a host-memory prompt
cache for what the proxy does not see, a folder for the lanes' slot files (they outlive a restart), its counters on
/metrics, and the model's own chat template with tools.

A slot's context is capped by the model's training context (the GGUF's `<arch>.context_length`): SmolLM2-135M says
8K, less than one Claude Code head; where the slot context asked for is longer, the GGUF's value is overridden
(`--override-kv`), as a user of a small model must do by hand.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

from stable_prefix.model_servers.server import LaneSetting, ModelServer
from stable_prefix.servers import LOOPBACK

LLAMA_CPP_BUILD = 11434
DEFAULT_SLOTS = 4
# Claude Code's head (system prompt and tools) is 14-20K tokens; a working conversation on top of it.
DEFAULT_SLOT_CONTEXT = 32768
# llama.cpp's own default, said here: a prompt a slot loses waits in RAM up to this many MiB.
CACHE_RAM_MIB = 8192
# A slot is chosen for a prompt by the prefix they share when it is at least this fraction of the prompt (else by LRU).
SLOT_PROMPT_SIMILARITY = 0.5

LANE_SETTINGS = (
    LaneSetting("-np N (--slots, default 4)", "a slot per lane: the main agent, a subagent and a title request each keep their KV "
                                             "(with one slot, each of them evicts the others: the field's 96% of prompt tokens reprocessed)"),
    LaneSetting("--kv-unified --kv-unified-per-slot T (--slot-context, default 32768)",
                "one KV pool of N x T tokens that the slots share, each slot up to T: every lane can be full at once"),
    LaneSetting("--no-cache-idle-slots", "an idle slot keeps its lane's KV (by default each new request copies every idle slot to the "
                                         "RAM cache and clears it: a lane pinned to its slot would find it empty)"),
    LaneSetting(f"--slot-prompt-similarity {SLOT_PROMPT_SIMILARITY}",
                "a request goes to the slot holding its lane's prefix, else to the least recently used one, the slot the proxy "
                "planned (llama-server drops id_slot on /v1/messages; at its default 0.1 a new subagent took the main lane's slot)"),
    LaneSetting("--cache-prompt", "a request reuses the longest prefix its slot already holds (llama.cpp's default, said)"),
    LaneSetting(f"--cache-ram {CACHE_RAM_MIB}", "a prompt evicted from a slot waits in host memory and is loaded back when its prompt "
                                               "returns: the net under what the proxy does not move itself (another client's requests)"),
    LaneSetting("--slot-save-path DIR", "where the proxy saves a lane's slot before another lane takes it, and restores it from "
                                        "(POST /slots/ID?action=save|restore): lanes outlive the slot count and a restart; not on "
                                        "sliding-window or recurrent models, whose restored slots llama.cpp prefills again"),
    LaneSetting("--metrics", "its own counters on /metrics (prompt tokens processed, per request in `timings`)"),
    LaneSetting("--jinja", "the model's own chat template, with tools: Claude Code's tool calls on /v1/messages need it"),
)


class GgufError(ValueError):
    """A file that is not a GGUF model llama-server could load."""


def llama_server_binary() -> str:
    """$LLAMA_SERVER, else `make llama-server`'s build (in the cache outside the clone), else one on PATH."""
    if os.environ.get("LLAMA_SERVER"):
        return os.environ["LLAMA_SERVER"]
    built = Path.home() / ".cache" / "stable-prefix" / f"llama.cpp-b{LLAMA_CPP_BUILD}" / "bin" / "llama-server"
    return str(built) if built.exists() else shutil.which("llama-server") or str(built)


# GGUF value types (ggml's gguf.h): fixed-size ones by struct format; 8 a string, 9 an array.
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def gguf_metadata(path: Path) -> dict[str, object]:
    """A GGUF file's metadata, its arrays left out (skipped, not read: the tokenizer's are large), never its tensors."""
    with path.open("rb") as file:
        def read(fmt: str):
            size = struct.calcsize("<" + fmt)
            data = file.read(size)
            if len(data) != size:
                raise GgufError(f"{path}: ends inside its metadata")
            return struct.unpack("<" + fmt, data)[0]

        def string() -> str:
            return file.read(read("Q")).decode("utf-8", "replace")

        def value(kind: int):
            if kind == _GGUF_STRING:
                return string()
            if kind == _GGUF_ARRAY:
                item_kind, count = read("I"), read("Q")
                if item_kind in _GGUF_SCALARS:
                    file.seek(count * struct.calcsize("<" + _GGUF_SCALARS[item_kind]), os.SEEK_CUR)
                else:
                    for _ in range(count):
                        value(item_kind)
                return None
            if kind not in _GGUF_SCALARS:
                raise GgufError(f"{path}: metadata value of unknown type {kind}")
            return read(_GGUF_SCALARS[kind])

        if file.read(4) != b"GGUF":
            raise GgufError(f"{path}: not a GGUF file (llama-server loads GGUF models)")
        read("I")  # version
        read("Q")  # tensors
        metadata = {}
        for _ in range(read("Q")):
            key = string()
            metadata[key] = value(read("I"))
    if not isinstance(metadata.get("general.architecture"), str):
        raise GgufError(f"{path}: no general.architecture in its metadata")
    return metadata


@dataclass(frozen=True)
class GgufModel:
    architecture: str
    trained_context: int | None  # `<arch>.context_length`
    # Whether a slot restored from a file is reused: not where a layer keeps a window or a recurrent state (sliding-
    # window attention, SSM layers), whose checkpoints a restore loses (llama.cpp #25913, #28194): such a slot is
    # prefilled again from its first token (measured with Gemma 3 270M: 0 of 291 restored tokens reused).
    restored_slots_reused: bool

    @classmethod
    def read(cls, path: Path) -> GgufModel:
        metadata = gguf_metadata(path)
        architecture = metadata["general.architecture"]
        windowed = f"{architecture}.attention.sliding_window" in metadata
        recurrent = any(key.startswith(f"{architecture}.ssm.") for key in metadata)
        return cls(architecture, metadata.get(f"{architecture}.context_length"), not (windowed or recurrent))


def check_model(model: str) -> str | None:
    path = Path(model).expanduser()
    if not path.is_file():
        return f"{model}: no such file (llama-server loads a GGUF file, e.g. build/gemma3-270m/gemma-3-270m-q4_k_m.gguf)"
    try:
        GgufModel.read(path)
    except (GgufError, OSError) as error:
        return str(error)
    return None


def slot_save_dir(model: Path) -> Path:
    """The lanes' slot files of this model: in the user's cache, one folder per model file (a slot file restores
    only into the model that wrote it), so a restarted stack finds its lanes."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    resolved = model.expanduser().resolve()
    identity = f"{resolved}\0{resolved.stat().st_size}".encode()
    return cache / "stable-prefix" / "llama.cpp-slots" / f"{resolved.stem}-{hashlib.sha256(identity).hexdigest()[:12]}"


def server_command(options, port: int) -> list[str]:
    model = Path(options.model).expanduser()
    gguf = GgufModel.read(model)
    save_dir = slot_save_dir(model)
    save_dir.mkdir(parents=True, exist_ok=True)
    command = [llama_server_binary(), "--model", str(model), "--host", LOOPBACK, "--port", str(port), "--alias", options.model_name,
               "--parallel", str(options.slots), "--kv-unified", "--kv-unified-per-slot", str(options.slot_context),
               "--no-cache-idle-slots", "--slot-prompt-similarity", str(SLOT_PROMPT_SIMILARITY), "--cache-prompt", "--cache-ram", str(CACHE_RAM_MIB), "--slot-save-path", str(save_dir),
               "--metrics", "--jinja"]
    if gguf.trained_context is not None and options.slot_context > gguf.trained_context:
        command += ["--override-kv", f"{gguf.architecture}.context_length=int:{options.slot_context}"]
    return command + list(options.engine_args)


def proxy_settings(options) -> dict[str, object]:
    """Lanes pinned to the slots; moved through slot files only where a restored slot is reused (else llama.cpp's
    RAM cache moves them: it keeps a sliding window's checkpoints)."""
    return {"llama_slots": options.slots, "llama_slot_files": GgufModel.read(Path(options.model).expanduser()).restored_slots_reused}


SERVER = ModelServer(
    name="llama.cpp",
    what="llama.cpp's llama-server",
    command=server_command,
    ready_path="/health",  # 503 while the model loads
    lane_settings=LANE_SETTINGS,
    reserved_flags=("--host", "--port", "--model", "-m", "--alias", "-a", "--parallel", "-np", "--kv-unified", "-kvu", "--no-kv-unified",
                    "-no-kvu", "--kv-unified-per-slot", "--slot-save-path", "--cache-idle-slots", "--no-cache-idle-slots",
                    "--slot-prompt-similarity", "-sps"),
    proxy_settings=proxy_settings,
    check_model=check_model,
)
