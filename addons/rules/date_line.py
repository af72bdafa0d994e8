"""date_line (off by default): a `Today's date is …` line out of the system prompt.

What the rule does, and why: its option's help below (docs/proxy.md's table
shows it).
"""

from __future__ import annotations

import re

from stable_prefix.addons.request_shape import Api
from stable_prefix.addons.rules.base import Change, Option, Rule
from stable_prefix.addons.rules.billing_header import drop_system_lines

NAME = "date_line"
_DATE_LINE = re.compile(r"^[ \t]*Today's date is\b")


def is_date_line(line: str) -> bool:
    return bool(_DATE_LINE.match(line))


def drop_date_line(body: dict, api: Api) -> list[Change]:
    return drop_system_lines(body, api, NAME, is_date_line, "date")


RULE = Rule(
    name=NAME,
    option=Option("drop_date_line", bool, False, "Remove a `Today's date is …` line from the system prompt (it changes once a day)."),
    label="date line",
    done="dropped",
    apply=drop_date_line,
    line=is_date_line,
)
