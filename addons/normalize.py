"""Running the rules over a request body: which run (`Rules`), in which order (`normalize`).

What is volatile and how each piece is made stable is `rules/` (one module
per rule, listed in `rules.RULES`, in the order they run); what a self-hosted
server and a strict router need of a body is `server_compat.py` and
`router_compat.py`, which run after the rules. Each edits the parsed body in
place and returns the `Change`s it made; the proxy's normalizer addon
(`normalizer.py`), the captures CLI (`diff
--normalized`) and the benchmark's client all normalize through here.
"""

from __future__ import annotations

from stable_prefix.addons import router_compat, rules, server_compat
from stable_prefix.addons.request_shape import Api
from stable_prefix.addons.rules.base import Change


class Rules:
    """Which rules run, named as the addon's options (`Rules(strip_billing_header=False)`; a rule
    not named runs as its option's default says), and the compatibility settings: `model_map`,
    (pattern, served name) pairs, the first match wins; `max_tokens_cap` (0: no cap);
    `strict_router_body`."""

    def __init__(self, *, model_map: tuple[tuple[str, str], ...] = (), max_tokens_cap: int = 0, strict_router_body: bool = False,
                 **switches: bool) -> None:
        options = {rule.option.name: rule for rule in rules.RULES}
        unknown = sorted(set(switches) - set(options))
        if unknown:
            raise TypeError(f"Rules(): no rule has the option {', '.join(unknown)} (they are {', '.join(options)})")
        self.on = frozenset(rule.name for rule in rules.RULES if switches.get(rule.option.name, rule.option.default))
        self.model_map = model_map
        self.max_tokens_cap = max_tokens_cap
        self.strict_router_body = strict_router_body

    def enabled(self, rule: str) -> bool:
        """Whether the rule of this name runs."""
        return rule in self.on

    def _settings(self) -> tuple:
        return self.on, self.model_map, self.max_tokens_cap, self.strict_router_body

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Rules) and self._settings() == other._settings()

    def __hash__(self) -> int:
        return hash(self._settings())

    def __repr__(self) -> str:
        return (f"Rules(on={sorted(self.on)}, model_map={self.model_map!r}, max_tokens_cap={self.max_tokens_cap}, "
                f"strict_router_body={self.strict_router_body})")


def normalize(body: dict, api: Api, settings: Rules | None = None) -> list[Change]:
    """Apply the enabled rules (all defaults when `settings` is None) to `body` in place; return what changed."""
    settings = settings or Rules()
    changes: list[Change] = []
    for rule in rules.RULES:
        if settings.enabled(rule.name):
            changes += rule.apply(body, api)
    if settings.model_map:
        changes += server_compat.map_model(body, settings.model_map)
    if settings.max_tokens_cap > 0:
        changes += server_compat.cap_max_tokens(body, settings.max_tokens_cap)
    if settings.strict_router_body:
        changes += router_compat.fit_strict_router(body, api)  # after the cap: the thinking budget is checked against what is sent
    return changes
