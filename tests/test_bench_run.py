"""How `make bench` orders and sizes its work (no servers)."""

import mlx.core as mx

from stable_prefix.bench.run import model_description, parse_args, turn_order
from stable_prefix.bench.stack import CONFIGURATIONS
from tests.support.models import REPO_ROOT, require_model


def test_interleaved_configurations_take_turns_going_first():
    configs = list(CONFIGURATIONS[:3])
    orders = [[config.key for config in turn_order(configs, turn)] for turn in range(4)]
    assert [order[0] for order in orders] == ["1-shipped", "2-shipped+addon", "3-patched", "1-shipped"]
    assert all(sorted(order) == sorted(config.key for config in configs) for order in orders)


def test_full_size_runs_the_product_the_batched_anchor_and_vllm_mlx_as_shipped_on_fewer_requests_of_full_size():
    args = parse_args(["--full"])
    assert args.scale == 1.0 and args.limit == 25 and args.name == "full" and args.incontext_repeats == 1
    assert [config.key for config in args.configurations] == ["4-patched+addon", "7-batched+addon", "1-shipped"]


def test_the_default_and_quick_sets_include_the_batched_anchor():
    assert "7-batched+addon" in [config.key for config in parse_args([]).configurations]
    assert "7-batched+addon" in [config.key for config in parse_args(["--quick"]).configurations]
    assert parse_args([]).interleave and not parse_args(["--sequential"]).interleave


def test_the_model_is_described_from_its_own_config_and_weights():
    model_dir = require_model(REPO_ROOT / "build" / "tiny-qwen3_5")
    described = model_description(model_dir)
    weights = mx.load(str(model_dir / "model.safetensors"))
    assert described["parameters_approx"] == sum(array.size for array in weights.values())
    assert (described["model_type"], described["layers"], described["dtype"]) == ("qwen3_5", 4, "float32")
    assert described["description"].startswith("random-weight qwen3_5, 4 layers, hidden 64, float32")
