"""stable_prefix/agents/claude_code.py: installing the pinned CLI and running it in a sandbox.

The last test runs the real CLI against a recording stub (no model): seconds,
not minutes, and it pins down what the slow end-to-end test relies on.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stable_prefix.agents import claude_code
from tests.support.processes import REPO_ROOT, VENV_BIN, free_port, running

STUB = REPO_ROOT / "tests" / "support" / "recording_anthropic_stub.py"


def test_install_without_npm_fails_and_says_what_is_missing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    with pytest.raises(claude_code.ClaudeCodeUnavailable, match="npm not found on PATH"):
        claude_code.install(tmp_path / "cli")


def test_find_binary_skips_the_placeholder_and_takes_the_platform_binary(tmp_path: Path) -> None:
    modules = tmp_path / "node_modules" / "@anthropic-ai"
    placeholder = modules / "claude-code" / "bin" / "claude.exe"
    placeholder.parent.mkdir(parents=True)
    placeholder.write_text("echo 'postinstall did not run'\n")
    native = modules / "claude-code-linux-x64" / "claude"
    native.parent.mkdir(parents=True)
    native.write_bytes(b"\x7fELF" + b"\0" * 60)
    assert claude_code.find_binary(tmp_path) == native


def test_find_binary_in_an_empty_folder_is_none(tmp_path: Path) -> None:
    assert claude_code.find_binary(tmp_path) is None


def test_sandbox_config_answers_the_first_run_dialogs(tmp_path: Path) -> None:
    sandbox = claude_code.create_sandbox(tmp_path, api_key="sk-test-" + "k" * 30)
    config = json.loads((sandbox.config_dir / ".claude.json").read_text())
    assert config["hasCompletedOnboarding"] is True
    assert config["customApiKeyResponses"]["approved"] == ["k" * 20]
    assert config["projects"][str(sandbox.workdir.resolve())]["hasTrustDialogAccepted"] is True


def test_environment_keeps_the_callers_credentials_and_proxies_out(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", "real-token")
    monkeypatch.setenv("HTTPS_PROXY", "http://corporate-proxy:3128")
    claude = claude_code.ClaudeCode(Path("/bin/true"), claude_code.create_sandbox(tmp_path), "http://127.0.0.1:9")
    environment = claude.environment()
    assert "ANTHROPIC_AUTH_TOKEN" not in environment and "HTTPS_PROXY" not in environment
    assert environment["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9"
    assert environment["HOME"] == str(tmp_path / "home")
    assert environment["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC" not in claude.environment(side_requests=True)


@pytest.mark.server
def test_a_print_turn_sends_one_main_request_with_the_billing_header(tmp_path: Path) -> None:
    try:
        binary = claude_code.install()
    except claude_code.ClaudeCodeUnavailable as error:
        pytest.fail(f"cannot install Claude Code: {error}", pytrace=False)
    record = tmp_path / "requests.jsonl"
    port = free_port()
    command = [str(VENV_BIN / "python"), str(STUB), "--port", str(port), "--record", str(record)]
    with running("stub", command, port=port, log_dir=tmp_path / "logs") as stub:
        claude = claude_code.ClaudeCode(binary, claude_code.create_sandbox(tmp_path / "claude"), stub.url)
        first = claude.print_turn("hello", timeout=120)
        second = claude.print_turn("again", continue_conversation=True, timeout=120)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert first.stdout.strip() == "OK."  # the stub's answer, printed by the CLI
    requests = [json.loads(line) for line in record.read_text().splitlines()]
    assert [request["path"] for request in requests] == ["/v1/messages?beta=true"] * 2
    first_body, second_body = (request["body"] for request in requests)
    assert first_body["system"][0]["text"].startswith("x-anthropic-billing-header:")
    assert first_body["tools"] and first_body["stream"] is True
    # --continue resends the first turn, then our answer and the new prompt.
    assert len(second_body["messages"]) == len(first_body["messages"]) + 2
    assert requests[0]["headers"]["x-claude-code-session-id"] == requests[1]["headers"]["x-claude-code-session-id"]
    assert requests[0]["headers"]["x-api-key"] == "<redacted>"
    # The conversation was kept in the sandbox's config folder, not the user's ~/.claude.
    assert list((claude.sandbox.config_dir / "projects").glob("*/*.jsonl"))
