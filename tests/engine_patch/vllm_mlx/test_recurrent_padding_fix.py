"""mlx-lm's padded prefill of recurrent layers, through its own `BatchGenerator` (no vllm-mlx):
what the installed mlx-lm and 0.32.2 do without our fix, and that with it a prompt prefilled beside
a longer one answers as alone on every family. The first test fails the day mlx-lm stops feeding the
padding into a hybrid family's state, so `engine_patch/vllm_mlx/batched/recurrent_padding_fix.py` is dropped once no
family needs it. Each check runs in a process of its own (the fix patches mlx-lm's class)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import mlx_lm
import pytest

from stable_prefix.engine_patch.vllm_mlx.batched.recurrent_padding_fix import cut_to_one_length
from tests.support.family_chat import FAMILY_MODELS
from tests.support.models import REPO_ROOT, require_model

MLX_LM_032 = REPO_ROOT / "build" / "mlx-lm-0.32"
HYBRIDS = ("qwen3_5", "nemotron_h")
FAMILIES = ("qwen3_5", "nemotron_h", "gpt_oss", "gemma3_text")
# The mlx-lm release that no longer lets the padding into a family's recurrent state (PR #1736: gated
# DeltaNet). Mamba2 (nemotron_h) is fixed in none yet.
FIXED_IN = {"qwen3_5": (0, 32, 2)}


def release(version: str) -> tuple[int, ...]:
    """`0.31.3` as (0, 31, 3): the numeric part of a release, enough to compare mlx-lm's."""
    return tuple(int(part) for part in version.split(".")[:3] if part.isdigit())


def answered_as_alone(families, *flags: str, pythonpath: str | None = None) -> dict[str, bool]:
    paths = [str(require_model(FAMILY_MODELS[family])) for family in families]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (pythonpath, str(REPO_ROOT))))}
    done = subprocess.run([sys.executable, "-m", "tests.support.padded_prefill_check", *flags, *paths],
                          capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    by_path = json.loads(done.stdout.strip().splitlines()[-1])
    return {family: by_path[path] for family, path in zip(families, paths)}


def test_the_installed_mlx_lm_still_feeds_prefill_padding_into_each_hybrids_recurrent_state():
    installed = release(mlx_lm.__version__)
    still_broken = [family for family in HYBRIDS if installed < FIXED_IN.get(family, (999,))]
    if not still_broken:
        pytest.skip(f"mlx-lm {mlx_lm.__version__} fixes every hybrid family's padded prefill: drop recurrent_padding_fix")
    as_alone = answered_as_alone(still_broken)
    fixed_upstream = [family for family, same in as_alone.items() if same]
    assert not fixed_upstream, (f"mlx-lm {mlx_lm.__version__} answers {fixed_upstream} beside a longer prompt as alone: "
                                "recurrent_padding_fix is no longer needed there (note it in FIXED_IN; drop the module once no family needs it)")


def test_mlx_lm_0_32_2_fixes_the_gated_deltanet_padding_but_not_mamba2s():
    if not (MLX_LM_032 / "mlx_lm").exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(MLX_LM_032), "mlx-lm==0.32.2"],
                       check=True, timeout=600)
    as_alone = answered_as_alone(HYBRIDS, pythonpath=str(MLX_LM_032))
    assert as_alone == {"qwen3_5": True, "nemotron_h": False}, "so the fix stays when vllm-mlx moves to mlx-lm 0.32"


def test_with_the_fix_a_prompt_prefilled_beside_a_longer_one_answers_as_alone_on_every_family():
    assert answered_as_alone(FAMILIES, "--fixed") == dict.fromkeys(FAMILIES, True)


def test_each_next_segment_is_cut_to_the_shortest_chunk_and_the_rest_kept_behind_it():
    short, longer, longest = [[1, 2, 3], [4]], [[1, 2, 3, 4, 5], [6]], [[1] * 10, [2] * 4, [3]]
    cut_to_one_length([short, longer, longest], step_size=8)
    assert short == [[1, 2, 3], [4]]
    assert longer == [[1, 2, 3], [4, 5], [6]]
    assert longest == [[1] * 3, [1] * 7, [2] * 4, [3]]


def test_segments_whose_next_chunks_already_have_one_length_are_left_as_they_are():
    first, second = [[1] * 10, [2]], [[1] * 9, [2]]
    cut_to_one_length([first, second], step_size=4)  # both prefill 4 tokens next
    assert first == [[1] * 10, [2]] and second == [[1] * 9, [2]]
