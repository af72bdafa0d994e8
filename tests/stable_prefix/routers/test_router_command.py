"""`stable-prefix router KIND --print` and `stable-prefix up --upstream URL`: one command per role."""

import pytest

from stable_prefix import cli, routers, stack

REPLICA_FLAGS = ["--replica", "http://10.0.0.2:8000", "--replica", "http://10.0.0.3:8000"]


def printed(capsys, *argv: str) -> str:
    assert cli.main(["router", *argv]) == 0
    return capsys.readouterr().out


def test_router_print_shows_haproxys_generated_config_and_how_to_run_it(capsys):
    out = printed(capsys, "haproxy", *REPLICA_FLAGS, "--port", "8095", "--print")
    assert out.startswith(f"# {routers.HAPROXY_CONFIG_NAME}\n")
    assert "bind 127.0.0.1:8095" in out and "balance hdr(x-smg-routing-key)" in out and "retry-on conn-failure" in out
    assert out.rstrip().endswith(f"-db -f {routers.HAPROXY_CONFIG_NAME}")


def test_router_print_shows_smgs_command_line_with_our_key_header(capsys):
    out = printed(capsys, "smg", *REPLICA_FLAGS, "--host", "0.0.0.0", "--print")
    assert "--worker-urls http://10.0.0.2:8000 http://10.0.0.3:8000" in out
    assert "--policy consistent_hashing" in out and "--routing-key-headers x-smg-routing-key" in out and "--host 0.0.0.0" in out


def test_router_print_of_vllm_router_hashes_x_session_id(capsys):
    out = printed(capsys, "vllm-router", *REPLICA_FLAGS, "--print")
    assert "--policy consistent_hash " in out


def test_router_refuses_a_bad_replica_url_with_a_clear_error(capsys):
    assert cli.main(["router", "smg", "--replica", "10.0.0.2:8000", "--print"]) == 2
    assert "expected http://HOST:PORT" in capsys.readouterr().err


def test_router_needs_at_least_one_replica(capsys):
    with pytest.raises(SystemExit):
        cli.main(["router", "haproxy", "--print"])


def test_up_upstream_runs_the_proxy_alone_with_the_team_options():
    options = stack.parse_options(["--upstream", "http://10.0.0.5:8090", "--served-model-name", "qwen3-coder"])
    assert options.upstream == "http://10.0.0.5:8090" and options.model_name == "qwen3-coder"
    assert "strict_router_body=true" in options.proxy_options
    assert "lane_routing_header=x-smg-routing-key,x-session-id" in options.proxy_options


def test_up_upstream_lets_set_override_a_team_option():
    options = stack.parse_options(["--upstream", "http://10.0.0.5:8090", "tiny", "--set", "strict_router_body=false"])
    assert options.proxy_options[-1] == "strict_router_body=false"  # the last --set wins in mitmproxy


def test_up_upstream_needs_the_served_models_name():
    with pytest.raises(stack.StackError, match="name the model the upstream serves"):
        stack.parse_options(["--upstream", "http://10.0.0.5:8090"])


def test_up_upstream_refuses_engine_flags():
    with pytest.raises(stack.StackError, match="--upstream starts no engine"):
        stack.parse_options(["--upstream", "http://10.0.0.5:8090", "tiny", "--", "--enable-auto-tool-choice"])


def test_up_without_a_model_or_an_upstream_says_what_it_needs():
    with pytest.raises(stack.StackError, match="or --upstream URL"):
        stack.parse_options([])


@pytest.mark.server
def test_router_runs_haproxy_before_the_replicas_until_stopped(tmp_path):
    from tests.support.llm_client import send
    from tests.support.processes import VENV_BIN, free_port, running
    from tests.support.slow_sse_upstream import slow_sse_upstream

    port = free_port()
    with slow_sse_upstream(event_delay=0.0) as replica:
        command = [str(VENV_BIN / "stable-prefix"), "router", "haproxy", "--replica", replica.url, "--port", str(port),
                   "--log-dir", str(tmp_path / "router")]
        log = tmp_path / f"router-command-{port}.log"  # as running() names it; ready once the command says so
        with running("router-command", command, port=port, log_dir=tmp_path,
                     ready=lambda: log.exists() and "Ctrl-C stops it" in log.read_text()) as router:
            answer = send(router.url, "/v1/messages", {"model": "m", "max_tokens": 4, "stream": True, "messages": [{"role": "user", "content": "hi"}]})
            router.process.terminate()
            assert router.process.wait(timeout=30) == 130
    assert answer.text and len(replica.received) == 1
    assert "stable-prefix router: haproxy on 127.0.0.1" in router.log_text()
