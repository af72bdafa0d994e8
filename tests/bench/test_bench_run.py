"""How `make bench` orders and sizes its work (no servers)."""

from pathlib import Path

import mlx.core as mx
import pytest

from stable_prefix.bench.clients.replay import PROXY_MAX_TOKENS_CAP, max_tokens_for
from stable_prefix.bench.clients.stack import CONFIGURATIONS, RAPID_MLX_VENV, configuration, engine_command, is_ours, proxy_options
from stable_prefix.bench.run import model_description, parse_args, turn_order
from stable_prefix.bench.workload.session import generate_session
from tests.support.models import REPO_ROOT, require_model


def test_interleaved_configurations_take_turns_going_first():
    configs = list(CONFIGURATIONS[:3])
    orders = [[config.key for config in turn_order(configs, turn)] for turn in range(4)]
    assert [order[0] for order in orders] == ["1-shipped", "2-shipped+addon", "3-patched", "1-shipped"]
    assert all(sorted(order) == sorted(config.key for config in configs) for order in orders)


def test_full_size_runs_the_product_the_two_strongest_anchors_and_the_product_without_drafts_on_fewer_requests():
    args = parse_args(["--full"])
    assert args.scale == 1.0 and args.limit == 25 and args.name == "full" and args.incontext_repeats == 1
    assert [config.key for config in args.configurations] == ["4-patched+addon", "7-batched+addon", "9-rapid-mlx+addon", "12-patched-no-drafts+addon"]


def test_the_default_and_quick_sets_include_the_batched_and_rapid_mlx_anchors():
    default = [config.key for config in parse_args([]).configurations]
    assert {"5-mlx-lm", "7-batched+addon", "8-rapid-mlx", "9-rapid-mlx+addon", "10-patched-simple+addon", "12-patched-no-drafts+addon"} <= set(default)
    quick = {config.key for config in parse_args(["--quick"]).configurations}
    assert {"4-patched+addon", "10-patched-simple+addon", "7-batched+addon", "9-rapid-mlx+addon"} <= quick
    assert parse_args([]).interleave and not parse_args(["--sequential"]).interleave


def test_configurations_carry_their_engine_flags_and_the_command_passes_them(tmp_path):
    batched = engine_command(configuration("7"), tmp_path, 8000)
    assert Path(batched[0]).name == "vllm-mlx" and batched[-1] == "--continuous-batching"
    assert "--continuous-batching" not in engine_command(configuration("2"), tmp_path, 8000)
    simple = engine_command(configuration("10-patched-simple+addon"), tmp_path, 8000)
    assert simple[1:3] == ["-m", "stable_prefix.engine_patch"] and simple[simple.index("--engine") + 1] == "simple"
    rapid = engine_command(configuration("9"), tmp_path, 8000, ["--log-level", "INFO"])
    assert rapid[0] == str(RAPID_MLX_VENV / "bin" / "vllm-mlx") and rapid[-2:] == ["--log-level", "INFO"]
    assert "--tool-call-parser" in rapid  # as a Claude Code user serves a Qwen model
    no_drafts = engine_command(configuration("12"), tmp_path, 8000)
    assert no_drafts[no_drafts.index("--draft") + 1] == "off"
    assert [config.number for config in CONFIGURATIONS if is_ours(config)] == ["3", "4", "10", "11", "12"]


def test_every_request_asks_for_max_tokens_as_the_addon_caps_it_unless_told_otherwise():
    session = generate_session(0, 0.04)
    assert parse_args([]).max_tokens == "proxy" and proxy_options()["max_tokens_cap"] == PROXY_MAX_TOKENS_CAP
    main, title = session[0], session[1]
    assert max_tokens_for(main, "proxy") == PROXY_MAX_TOKENS_CAP < main.body["max_tokens"]
    assert max_tokens_for(title, "proxy") == title.body["max_tokens"] == 512
    assert max_tokens_for(main, "session") == main.reply_tokens and max_tokens_for(main, 16) == 16
    assert parse_args(["--max-tokens", "session"]).max_tokens == "session" and parse_args(["--max-tokens", "64"]).max_tokens == 64


@pytest.mark.parametrize("value", ["0", "many", "-3"])
def test_a_max_tokens_that_is_no_policy_is_refused(value, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--max-tokens", value])
    assert "--max-tokens" in capsys.readouterr().err


def test_the_model_is_described_from_its_own_config_and_weights():
    model_dir = require_model(REPO_ROOT / "build" / "tiny-qwen3_5")
    described = model_description(model_dir)
    weights = mx.load(str(model_dir / "model.safetensors"))
    assert described["parameters_approx"] == sum(array.size for array in weights.values())
    assert (described["model_type"], described["layers"], described["dtype"]) == ("qwen3_5", 4, "float32")
    assert described["description"].startswith("random-weight qwen3_5, 4 layers, hidden 64, float32")
    assert described["attention"] == "hybrid" and described["cache_kinds"] == ["ArraysCache", "KVCache"]
    assert model_description(require_model())["attention"] == "plain"
