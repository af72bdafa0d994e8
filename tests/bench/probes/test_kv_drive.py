"""The bytes bench's in-process driver (bench/probes/kv_drive.py): the engine's own cache served a session's token
sequences with random arrays of the model's shapes. What the bench multiplies back must be exactly per layer."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from stable_prefix.bench.measure.token_states import unique_token_states
from stable_prefix.bench.probes import kv_drive
from stable_prefix.bench.probes.kv_session_file import SessionFile
from stable_prefix.bench.run import as_received
from stable_prefix.bench.workload.kv_sessions import lane_of, reply_ids
from stable_prefix.bench.workload.kv_shapes import model_bytes
from stable_prefix.bench.workload.prompt_tokens import PromptRenderer
from stable_prefix.bench.workload.session import generate_session
from stable_prefix.tools.tiny_families import FAMILIES
from tests.support.processes import REPO_ROOT

PLAIN = REPO_ROOT / "build" / "tiny-model"
HYBRID_TOKENIZER = REPO_ROOT / "build" / "tiny-qwen3_5"  # the ChatML template with thinking, Qwen3's tokens
REQUESTS = 7  # the first conversation's head, its title, turns, and the fan-out's first instance


def session_file(model_dir, path):
    requests = generate_session(0, 0.04)[:REQUESTS]
    renderer = PromptRenderer(model_dir, "tiny-model", "hermes")
    bodies = [as_received(request.body, True) for request in requests]
    SessionFile([lane_of(r) for r in requests], [renderer.head_text(b) for b in bodies],
                [np.asarray(renderer.token_ids(b)) for b in bodies], [reply_ids(r, 8) for r in requests], {"session": "test"}).save(path)
    return path


def drive(tmp_path, model_dir, tokens, layers, name):
    out = tmp_path / f"{name}.json"
    kv_drive.main(["--tokens", str(tokens), "--model", str(model_dir), "--layers", str(layers), "--ram-bytes", str(2**30),
                   "--disk-bytes", str(2**30), "--disk-dir", str(tmp_path / f"{name}-kv"), "--out", str(out)])
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def hybrid_model(tmp_path_factory):
    """The Qwen3-Next layout with 8 of its 48 layers (2 of them attention, as 12 in 48), Qwen3.5's tokenizer files."""
    directory = tmp_path_factory.mktemp("next")
    for path in HYBRID_TOKENIZER.glob("tokenizer*"):
        shutil.copy(path, directory)
    family = FAMILIES["qwen3_next"]
    config = family.config(family.default_shape) | {"num_hidden_layers": 8, "torch_dtype": "float16"}
    (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory):
    directory = tmp_path_factory.mktemp("plain")
    return drive(directory, PLAIN, session_file(PLAIN, directory / "session.npz"), 2, "plain")


@pytest.mark.parametrize("kind", ["plain", pytest.param("hybrid", marks=pytest.mark.slow)])
def test_half_the_layers_make_the_same_decisions_with_half_the_bytes(tmp_path, hybrid_model, kind):
    model = PLAIN if kind == "plain" else hybrid_model
    layers = 2 if kind == "plain" else 8
    tokens = session_file(model, tmp_path / "session.npz")
    whole, half = drive(tmp_path, model, tokens, layers, "whole"), drive(tmp_path, model, tokens, layers // 2, "half")
    assert [r["reused"] for r in whole["requests"]] == [r["reused"] for r in half["requests"]]
    assert any(r["reused"] for r in whole["requests"])
    assert whole["end_stats"]["bytes"] == 2 * half["end_stats"]["bytes"]
    assert whole["end_stats"]["entries"] == half["end_stats"]["entries"]
    assert whole["end_stats"]["disk_writes"] == half["end_stats"]["disk_writes"]
    # Files carry a header that is not per layer (token ids, the layers' description): within 2% here.
    assert whole["end_stats"]["disk_bytes_written"] == pytest.approx(2 * half["end_stats"]["disk_bytes_written"], rel=0.02)


def test_ram_holds_its_lanes_token_states_and_no_padding(plain_run):
    """The driver hands over caches cut to their tokens (as the batched engine does): RAM holds at most each
    lane's token states, and at least each distinct one once."""
    run = plain_run
    assert run["bytes_per_token"] == model_bytes(PLAIN)[0] == 512
    lanes = [np.asarray(entry["tokens"]) for entry in run["held"]["ram"]]
    assert unique_token_states(lanes) * 512 <= run["end_stats"]["bytes"] <= sum(len(lane) for lane in lanes) * 512


def test_every_lane_is_warm_in_ram_and_on_disk_within_budget(plain_run):
    run = plain_run
    assert all(lane["warm_in_ram"] for lane in run["lanes"].values())
    assert all(run["restart"]["warm_on_disk"].values())
    assert run["restart"]["stats"]["disk_loads"] == len(run["lanes"])
