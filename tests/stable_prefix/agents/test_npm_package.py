"""The pinned npm install and the user's binary that every agent's installer shares (`stable_prefix/agents/npm_package.py`)."""

import json
from pathlib import Path

import pytest

from stable_prefix.agents import npm_package
from stable_prefix.agents.npm_package import AgentUnavailable


def installed_tree(prefix: Path, package: str, version: str) -> None:
    manifest = prefix / "node_modules" / package / "package.json"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"name": package, "version": version}))


def test_the_pinned_version_already_installed_is_not_installed_again(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "no-npm-here"))
    installed_tree(tmp_path, "@scope/agent", "1.2.3")
    npm_package.install_package(tmp_path, "@scope/agent", "1.2.3")  # npm would not be found


def test_another_version_needs_npm_and_says_so_when_there_is_none(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "no-npm-here"))
    installed_tree(tmp_path, "@scope/agent", "1.2.2")
    with pytest.raises(AgentUnavailable, match=r"npm not found on PATH, so @scope/agent 1.2.3 cannot be installed"):
        npm_package.install_package(tmp_path, "@scope/agent", "1.2.3")


def test_an_install_without_the_binary_names_what_is_missing(tmp_path):
    installed_tree(tmp_path, "agent", "1.0.0")
    with pytest.raises(AgentUnavailable, match=r"npm installed agent@1.0.0 into .*, but its native binary is not in it"):
        npm_package.install_binary(tmp_path, "agent", "1.0.0", lambda prefix: None, "its native binary")


def test_a_binary_that_reports_another_version_is_refused(tmp_path):
    installed_tree(tmp_path, "agent", "1.0.0")
    binary = tmp_path / "agent"
    with pytest.raises(AgentUnavailable, match=r"reports version '0.9.0', expected 1.0.0"):
        npm_package.install_binary(tmp_path, "agent", "1.0.0", lambda prefix: binary, "its binary", reported_version=lambda _: "0.9.0")


def test_the_users_binary_is_the_one_named_else_the_one_on_path_else_the_pinned_one(tmp_path, monkeypatch):
    on_path = tmp_path / "bin" / "agent"
    on_path.parent.mkdir()
    on_path.write_text("#!/bin/sh\n")
    on_path.chmod(0o755)
    pinned = tmp_path / "pinned" / "agent"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert npm_package.user_binary(str(on_path), "agent", pinned, "") == on_path
    monkeypatch.setenv("PATH", str(on_path.parent))
    assert npm_package.user_binary(None, "agent", pinned, "") == on_path
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert npm_package.user_binary(None, "agent", pinned, "") == pinned


def test_no_binary_at_all_says_how_to_install_one(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    hint = npm_package.how_to_install("@scope/agent", "1.2.3", tmp_path / ".cli", "agent_module")
    with pytest.raises(AgentUnavailable, match=r"no agent found: none on PATH and no pinned install\. Install it with "
                                                r"`npm install -g @scope/agent`, or the pinned 1.2.3 into .*/\.cli with "
                                                r"`python -m stable_prefix.agents.agent_module install`\."):
        npm_package.user_binary(None, "agent", None, hint)
    with pytest.raises(AgentUnavailable, match="not an executable file"):
        npm_package.user_binary(str(tmp_path / "missing"), "agent", None, hint)
