"""Adding an agent is one module and one line: every record is in the roster, and the CLI, the bench, the tests'
fixtures, the proxy's lanes and the doctor's pins are made from it (read from the source and the objects; nothing is
installed)."""

import ast
import inspect
import re
from pathlib import Path

import pytest

from stable_prefix import cli, doctor, stack
from stable_prefix.addons import lanes
from stable_prefix.agents import base
from stable_prefix.agents.roster import AGENTS
from stable_prefix.bench.clients import agent_clients, cli_agents
from tests import conftest
from tests.support.processes import REPO_ROOT

AGENT_MODULES = sorted((REPO_ROOT / "stable_prefix" / "agents").glob("*.py"))


def defines_a_record(path) -> bool:
    """Whether a module assigns `AGENT = CodingAgent(...)` at its top level."""
    tree = ast.parse(path.read_text())
    return any(isinstance(node, ast.Assign) and any(getattr(target, "id", None) == "AGENT" for target in node.targets)
               for node in tree.body)


def test_every_agent_module_that_defines_a_record_is_in_the_roster():
    listed = {inspect.getsourcefile(agent.install) for agent in AGENTS}
    defining = {str(path) for path in AGENT_MODULES if defines_a_record(path)}
    assert defining == listed, f"records not in roster.AGENTS: {sorted(defining - listed)}"


def test_each_record_is_its_own_modules_agent_and_its_key_and_fixture_are_unique():
    for agent in AGENTS:
        assert inspect.getmodule(agent.install).AGENT is agent
    assert len({agent.key for agent in AGENTS}) == len(AGENTS)
    assert len({agent.fixture for agent in AGENTS}) == len(AGENTS)


def test_every_record_names_its_protocol_and_one_of_its_launcher_or_how_it_is_launched():
    for agent in AGENTS:
        assert agent.protocol in base.PROTOCOLS
        assert (agent.launcher is None) == bool(agent.launched_by), agent.key


def test_the_doctor_checks_every_records_pin_in_the_rosters_order():
    assert doctor.agent_pins() == tuple(agent.pin for agent in AGENTS)


# Where a second table of agents would be: the project's code and the Makefile (not the tests).
PROJECT_SOURCES = [path for folder in ("stable_prefix", "addons", "bench", "tools", "engine_patch")
                   for path in sorted((REPO_ROOT / folder).rglob("*.py"))] + [REPO_ROOT / "Makefile"]


@pytest.mark.parametrize("agent", AGENTS, ids=lambda agent: agent.key)
def test_an_agents_package_is_named_in_its_own_module_and_nowhere_else(agent):
    # Its pin is its record's: no table beside the roster (pins.py, the doctor, the Makefile) names it again.
    quoted = re.compile(rf"""["']{re.escape(agent.pin.package)}["']""")
    naming = {str(path) for path in PROJECT_SOURCES if quoted.search(path.read_text())}
    assert naming == {inspect.getsourcefile(agent.install)}


@pytest.mark.parametrize("agent", [agent for agent in AGENTS if agent.launcher], ids=lambda agent: agent.key)
def test_the_cli_offers_a_command_for_each_record_with_a_launcher(agent):
    help_line, run = cli.COMMANDS[agent.key]
    assert run == agent.launch
    assert help_line.startswith(f"{agent.name} against the running stack: {agent.key} [--port 8080]")


def test_up_tells_how_to_start_every_other_agent_with_a_launcher():
    told = stack.other_agents_instructions(" --port 9000").splitlines()
    assert told[1:] == [f"    stable-prefix {agent.key} --port 9000" for agent in AGENTS if agent.launcher and agent.key != "claude"]


def test_the_cli_offers_no_command_for_an_agent_launched_another_way():
    assert all(agent.key not in cli.COMMANDS for agent in AGENTS if agent.launcher is None)


@pytest.mark.parametrize("agent", AGENTS, ids=lambda agent: agent.key)
def test_the_tests_have_an_install_fixture_for_each_record(agent, request):
    assert hasattr(conftest, agent.fixture)
    definitions = request.session._fixturemanager.getfixturedefs(agent.fixture, request.node)
    assert definitions and definitions[-1].scope == "session"


def test_the_bench_drives_every_record_with_a_conversation_and_replays_every_measured_one():
    assert set(cli_agents.AGENTS) == {agent.key for agent in AGENTS if agent.conversation}
    assert set(agent_clients.CLIENTS) == {agent.key for agent in AGENTS if agent.resends}
    for key, client in agent_clients.CLIENTS.items():
        record = next(agent for agent in AGENTS if agent.key == key)
        assert (client.after_error_event, client.after_silent_cut) == (record.resends.after_error_event, record.resends.after_silent_cut)


def test_the_proxys_lanes_tell_apart_every_record_with_lane_facts_and_read_the_same_resends():
    assert lanes.AGENTS == tuple(agent for agent in AGENTS if agent.lanes)
    for agent in lanes.AGENTS:
        # One fact, two readers: the stream recovery's (`resends_after_error_event`) is the bench's (`CLIENTS`).
        assert agent.resends_after_error_event == (agent_clients.CLIENTS[agent.key].after_error_event is not None)


def imported_names(path) -> set[str]:
    """Every `from X import Y` of a module, as X and as X.Y."""
    found = set()
    for node in ast.walk(ast.parse(Path(path).read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return found


def test_no_agent_module_borrows_from_another_agents_module():
    # What agents share lives in base.py, npm_package.py, scratch_project.py and driver.py; only the modules that
    # drive Claude Code itself (the router's, the SDK's) import claude_code.
    modules = {inspect.getmodule(agent.install).__name__: inspect.getsourcefile(agent.install) for agent in AGENTS}
    drives_claude_code = {"stable_prefix.agents.claude_code_router", "stable_prefix.agents.claude_agent_sdk"}
    for module, path in modules.items():
        allowed = {module} | ({"stable_prefix.agents.claude_code"} if module in drives_claude_code else set())
        borrowed = (imported_names(path) & set(modules)) - allowed
        assert not borrowed, f"{module} imports {sorted(borrowed)}"
