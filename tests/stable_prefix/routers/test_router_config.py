"""stable_prefix/routers.py: the command line and config each router runs with, for a list of replicas."""

import subprocess

import pytest

from stable_prefix import routers
from stable_prefix.routers import router_config

REPLICAS = ["http://10.0.0.2:8000", "http://10.0.0.3:8000"]


def argv_after(config, flag: str) -> list[str]:
    """The values a flag takes in an argv (up to the next flag)."""
    argv = list(config.argv)
    values = []
    for part in argv[argv.index(flag) + 1:]:
        if part.startswith("--"):
            break
        values.append(part)
    return values


def test_smg_hashes_our_key_header_onto_its_replicas():
    config = router_config("smg", REPLICAS, port=30000)
    assert argv_after(config, "--policy") == ["consistent_hashing"]
    assert argv_after(config, "--routing-key-headers") == ["x-smg-routing-key"]
    assert argv_after(config, "--worker-urls") == REPLICAS
    assert config.key_header == "x-smg-routing-key"


def test_smg_reads_the_first_of_the_proxys_header_names():
    config = router_config("smg", REPLICAS, port=30000, key_header="x-team-key,x-session-id")
    assert argv_after(config, "--routing-key-headers") == ["x-team-key"]


def test_smg_prefix_policy_is_its_cache_aware_one_and_reads_no_key():
    config = router_config("smg", REPLICAS, port=30000, policy="prefix")
    assert argv_after(config, "--policy") == ["cache_aware"]
    assert "--routing-key-headers" not in config.argv and config.key_header is None


def test_smg_checks_health_at_the_interval_asked_for_in_whole_seconds():
    config = router_config("smg", REPLICAS, port=30000, health_interval_s=0.4)
    assert argv_after(config, "--health-check-interval-secs") == ["1"]
    assert argv_after(config, "--health-check-endpoint") == ["/health"]


def test_vllm_router_hashes_x_session_id():
    config = router_config("vllm-router", REPLICAS, port=30001)
    assert argv_after(config, "--policy") == ["consistent_hash"]
    assert config.key_header == "x-session-id"


def test_vllm_router_refuses_a_header_it_cannot_read():
    with pytest.raises(ValueError, match="vllm-router reads its key from x-session-id"):
        router_config("vllm-router", REPLICAS, port=30001, key_header="x-smg-routing-key")


def test_haproxy_balances_on_the_key_header_with_consistent_hashing():
    text = router_config("haproxy", REPLICAS, port=8090).config_text
    assert "balance hdr(x-smg-routing-key)" in text and "hash-type consistent" in text
    assert "server replica1 10.0.0.2:8000 check" in text and "server replica2 10.0.0.3:8000 check" in text
    assert "bind 127.0.0.1:8090" in text


def test_haproxy_streams_at_once_and_retries_a_dead_servers_connection_elsewhere():
    text = router_config("haproxy", REPLICAS, port=8090).config_text
    for line in ("option http-no-delay", "option redispatch 1", "retry-on conn-failure empty-response",
                 "option http-buffer-request", f"tune.bufsize {routers.HAPROXY_BUFFER_BYTES}", "option httpchk GET /health"):
        assert line in text


def test_haproxy_bounds_each_replicas_load_when_asked(tmp_path):
    config = router_config("haproxy", REPLICAS, port=8090, balance_factor=150)
    assert "hash-type consistent\n    hash-balance-factor 150" in config.config_text
    check = subprocess.run([str(routers.router_binary("haproxy")), "-c", "-f", config.command(tmp_path)[-1]], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.parametrize(("kind", "policy", "factor"), [("smg", "key", 150), ("haproxy", "round_robin", 150), ("haproxy", "key", 100)])
def test_a_balance_factor_bounds_haproxys_consistent_hashing_only_and_above_the_average(kind, policy, factor):
    with pytest.raises(ValueError, match="balance factor"):
        router_config(kind, REPLICAS, port=8090, policy=policy, balance_factor=factor)


def test_haproxy_round_robin_has_no_hash():
    text = router_config("haproxy", REPLICAS, port=8090, policy="round_robin").config_text
    assert "balance roundrobin" in text and "hash-type" not in text


def test_haproxy_has_no_prefix_policy():
    with pytest.raises(ValueError, match="haproxy has no prompt-text policy"):
        router_config("haproxy", REPLICAS, port=8090, policy="prefix")


def test_haproxy_runs_the_config_file_written_beside_its_log(tmp_path):
    config = router_config("haproxy", REPLICAS, port=8090)
    command = config.command(tmp_path)
    assert command[-1] == str(tmp_path / routers.HAPROXY_CONFIG_NAME)
    assert (tmp_path / routers.HAPROXY_CONFIG_NAME).read_text() == config.config_text


def test_the_generated_haproxy_config_is_valid_for_haproxy_itself(tmp_path):
    binary = routers.router_binary("haproxy")
    command = router_config("haproxy", REPLICAS, port=8090).command(tmp_path)
    check = subprocess.run([str(binary), "-c", "-f", command[-1]], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.parametrize("url", ["10.0.0.2:8000", "http://10.0.0.2", "http://10.0.0.2:8000/v1", "https://10.0.0.2:8000"])
def test_a_replica_url_that_is_not_an_engines_base_url_is_refused(url):
    with pytest.raises(ValueError, match="expected http://HOST:PORT"):
        router_config("smg", [url], port=30000)


def test_no_replicas_is_refused():
    with pytest.raises(ValueError, match="no replica URLs"):
        router_config("haproxy", [], port=8090)


def test_an_unknown_router_or_policy_is_refused():
    with pytest.raises(ValueError, match="router 'nginx'"):
        router_config("nginx", REPLICAS, port=8090)
    with pytest.raises(ValueError, match="policy 'sticky'"):
        router_config("smg", REPLICAS, port=8090, policy="sticky")


def test_a_missing_install_names_the_make_target(monkeypatch, tmp_path):
    monkeypatch.setattr(routers, "SMG_VENV", tmp_path / "nowhere")
    with pytest.raises(routers.RouterNotInstalled, match="make routers"):
        routers.router_binary("smg")


def test_the_rust_routers_metrics_go_to_the_port_asked_for():
    for kind in ("smg", "vllm-router"):
        assert argv_after(router_config(kind, REPLICAS, port=30000, metrics_port=30001), "--prometheus-port") == ["30001"]
