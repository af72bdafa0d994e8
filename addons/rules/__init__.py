"""The proxy's rules: what is volatile in a coding agent's request, and how each piece is made stable.

This package is the one owner of that definition: the proxy addon
(`strip_billing.py`), the prefix diagnosis (`diagnosis.py`), lane signatures
(`lanes.py`) and the captures CLI (`python -m stable_prefix.captures diff
--normalized`) all read it here. Each rule is one module, holding its record
`RULE` (`base.Rule`: name, option, label, what it changes, how the diagnosis
recognises a break it would have prevented) and the agents' texts it looks
for; what each does for a user is its option's help, which docs/proxy.md's
table shows.

`RULES` is the one list: the addon declares each rule's option and runs the
rules in this order (`normalize.normalize`), the diagnosis asks each of them in
this order. The order matters where two rules write into the first user
message: the git status goes in first, then the conversation context and turn
reminders after it, before the initial context is put in front of that message
and before system messages become user messages.

Adding a rule: a module here with its `RULE`, and its place in `RULES`
(docs/proxy.md, "Adding a rule"). The rules a self-hosted server or a router
needs, which leave the prompt as it is, are `server_compat.py` and
`router_compat.py`.
"""

from __future__ import annotations

from stable_prefix.addons.rules import (
    billing_header,
    conversation_context,
    date_line,
    git_status,
    initial_context,
    loaded_tools,
    system_messages,
    tool_order,
    turn_reminders,
)
from stable_prefix.addons.rules.base import Rule

RULES: tuple[Rule, ...] = (
    billing_header.RULE,
    git_status.RULE,
    conversation_context.RULE,
    turn_reminders.RULE,
    initial_context.RULE,
    system_messages.RULE,
    loaded_tools.RULE,
    date_line.RULE,
    tool_order.RULE,
)


def rule_named(name: str) -> Rule:
    return next(rule for rule in RULES if rule.name == name)


def without_subjects(text: str) -> str:
    """A system text without the runs the rules' spans find in it (whether those rules are on or
    not), as they leave it: a span that runs to the end cut with the line breaks before it (a git
    status paragraph), the others cut out."""
    for rule in RULES:
        if rule.spans is not None:
            text = _cut(text, rule.spans(text))
    return text


def _cut(text: str, spans) -> str:
    kept, position = [], 0
    for start, end in spans:
        kept.append(text[position:start])
        if end is None:
            return "".join(kept).rstrip("\n")
        position = end
    return "".join(kept) + text[position:]


def is_subject_line(line: str) -> bool:
    """A line of system text some rule takes out (a rule with spans is taken out by `without_subjects`)."""
    return any(rule.line(line) for rule in RULES if rule.line is not None and rule.spans is None)
