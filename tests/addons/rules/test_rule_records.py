"""A rule is one record in one module of addons/rules/, listed once in `rules.RULES`: the addon
declares its option from the list, `normalize` runs it from the list, the diagnosis asks it from
the list, and docs/proxy.md's table of rules is the records' own text."""

import copy
import pkgutil
import re
from pathlib import Path

import pytest
from mitmproxy.test import taddons

from stable_prefix.addons import normalize, rules
from stable_prefix.addons.diagnosis import PrefixDiagnosis, PromptSnapshot
from stable_prefix.addons.rules.base import Change, Option, Rule
from stable_prefix.addons.rules.billing_header import drop_system_lines
from tests.fixtures import claude_code
from tests.support.proxy_addons import ProxyAddons

DOCS = Path(__file__).resolve().parents[3] / "docs" / "proxy.md"
TABLE_START = "<!-- the rules' table: made from addons/rules by tests/addons/rules/test_rule_records.py, which prints it when it drifts -->"
TABLE_END = "<!-- end of the rules' table -->"


def markdown_table(records) -> str:
    rows = ["| rule | option (`--set name=value`) | default | in the diagnosis | what it does |", "|---|---|---|---|---|"]
    rows += [f"| `{rule.name}` | `{rule.option.name}` | `{str(rule.option.default).lower()}` | {rule.label}; {rule.done} | {rule.option.help} |"
             for rule in records]
    return "\n".join(rows)


def test_every_module_of_the_rules_folder_is_one_record_in_the_list():
    modules = {module.name for module in pkgutil.iter_modules(rules.__path__)} - {"base"}
    listed = {rule.apply.__module__.rsplit(".", 1)[-1] for rule in rules.RULES}
    assert listed == modules
    for name in modules:
        record = __import__(f"stable_prefix.addons.rules.{name}", fromlist=["RULE"]).RULE
        assert isinstance(record, Rule) and record in rules.RULES


def test_rule_names_options_and_labels_are_each_used_once():
    for field in ("name", "label"):
        values = [getattr(rule, field) for rule in rules.RULES]
        assert len(set(values)) == len(values), field
    options = [rule.option.name for rule in rules.RULES]
    assert len(set(options)) == len(options)


def test_every_rule_option_is_a_bool_the_addon_declares_with_the_records_default_and_help():
    with taddons.context(ProxyAddons()) as tctx:
        for rule in rules.RULES:
            declared = tctx.options._options[rule.option.name]
            assert (declared.typespec, declared.default, declared.help) == (bool, rule.option.default, rule.option.help)


def test_every_rule_has_a_detector_the_diagnosis_asks_or_names_the_rule_whose_detectors_find_its_subject():
    for rule in rules.RULES:
        detectors = [rule.line, rule.spans, rule.at_break]
        if rule.named_by is None:
            assert any(detector is not None for detector in detectors), rule.name
        else:
            assert all(detector is None for detector in detectors), rule.name
            named_by = rules.rule_named(rule.named_by)
            assert named_by.named_by is None and named_by is not rule


# --- a made-up rule, added to the list and nowhere else ------------------------------------------

SHOUT = "SHOUT: the build is red"


def is_shout_line(line: str) -> bool:
    return line.startswith("SHOUT:")


def drop_shout_lines(body: dict, api) -> list[Change]:
    return drop_system_lines(body, api, "shout_line", is_shout_line, "shout")


SHOUT_RULE = Rule(name="shout_line", option=Option("drop_shout_lines", bool, True, "Remove a `SHOUT: …` line from the system prompt."),
                  label="shout line", done="dropped", apply=drop_shout_lines, line=is_shout_line)


@pytest.fixture
def with_shout_rule(monkeypatch):
    monkeypatch.setattr(rules, "RULES", (*rules.RULES, SHOUT_RULE))


def shouting(request: dict, shout: str = SHOUT) -> dict:
    body = copy.deepcopy(request)
    body["system"][1]["text"] = f"{shout}\n{body['system'][1]['text']}"
    return body


def test_a_rule_added_to_the_list_is_declared_by_the_addon_and_switched_by_its_option(with_shout_rule):
    addon = ProxyAddons()
    with taddons.context(addon) as tctx:
        assert tctx.options.drop_shout_lines is True and addon.rules.enabled("shout_line")
        tctx.configure(addon, drop_shout_lines=False)
        assert not addon.rules.enabled("shout_line")


def test_a_rule_added_to_the_list_runs_with_the_others(with_shout_rule):
    body = shouting(claude_code.main_request())
    changes = normalize.normalize(body, "anthropic")
    assert changes[-1] == Change("shout_line", "system[0]", "removed shout line")  # the billing block went before: it ran first
    assert SHOUT not in str(body["system"]) and "x-anthropic-billing-header" not in str(body["system"])


def test_a_rule_added_to_the_list_is_named_by_the_diagnosis(with_shout_rule):
    def second_turn(rule_settings):
        diagnosis = PrefixDiagnosis(rule_settings)
        for body in (shouting(claude_code.main_request(turns=1)), shouting(claude_code.main_request(turns=2), "SHOUT: the build is green")):
            forwarded = copy.deepcopy(body)
            normalize.normalize(forwarded, "anthropic", rule_settings)
            result = diagnosis.observe(PromptSnapshot.of(body, "anthropic"), forwarded)
        return result

    off, on = second_turn(normalize.Rules(drop_shout_lines=False)), second_turn(normalize.Rules())
    assert (off.cause, off.explained_by) == ("shout line; drop_shout_lines off", "shout_line")
    assert on.cause is None and on.line().endswith("(shout line; dropped)")


# --- the documentation --------------------------------------------------------------------------


def test_the_docs_table_of_rules_is_made_from_the_records():
    text = DOCS.read_text()
    found = re.search(re.escape(TABLE_START) + r"\n(.*?)\n" + re.escape(TABLE_END), text, re.DOTALL)
    expected = markdown_table(rules.RULES)
    assert found is not None, f"docs/proxy.md lacks the rules' table between its markers; it reads:\n{TABLE_START}\n{expected}\n{TABLE_END}"
    assert found.group(1) == expected, f"docs/proxy.md's table of rules drifted from addons/rules; it should read:\n{expected}"
