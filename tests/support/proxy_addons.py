"""The proxy's addons driven by hand in a test, as mitmproxy drives a script's list: each hook on each addon,
in the list's order.

`ProxyAddons()` is strip_billing.py's list but llama.cpp's slot lanes (async hooks, off by default) and the
stream recovery (it wraps every stream): the tests of those add them by name. `DiagnosedCapture(capture)` is
capture.py with the one diagnosis before it (the normalizer, the diagnosis, the Responses chains), for tests of
a record's lane and diagnosis with no rules applied (configure it with `**NO_RULES`). Registered in
`taddons.context`, mitmproxy loads and configures the addons in `addons` (its sub-addon idiom); the flow hooks
are called on this object, which passes each to every addon that has it.
"""

from __future__ import annotations

from mitmproxy import http

from stable_prefix.addons import rules
from stable_prefix.addons.capture import Capture
from stable_prefix.addons.llama_slots import LlamaSlots
from stable_prefix.addons.normalizer import Normalizer
from stable_prefix.addons.prefix_diagnosis import DiagnosePrefix
from stable_prefix.addons.response_chains import FollowResponseChains, ResponseChains
from stable_prefix.addons.stream_recovery import StreamRecovery
from stable_prefix.addons.strip_billing import proxy_addons

# Every rule's option off: the body is forwarded as sent, and the diagnosis names each rule that would have helped.
NO_RULES = {rule.option.name: False for rule in rules.RULES}


class AddonList:
    def __init__(self, addons: list) -> None:
        self.addons = addons

    def _run(self, hook: str, *args) -> None:
        for addon in self.addons:
            method = getattr(addon, hook, None)
            if method is not None:
                method(*args)

    def request(self, flow: http.HTTPFlow) -> None:
        self._run("request", flow)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        self._run("responseheaders", flow)

    def response(self, flow: http.HTTPFlow) -> None:
        self._run("response", flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._run("error", flow)

    def running(self) -> None:
        self._run("running")

    def done(self) -> None:
        self._run("done")


class ProxyAddons(AddonList):
    def __init__(self) -> None:
        super().__init__([addon for addon in proxy_addons() if not isinstance(addon, (LlamaSlots, StreamRecovery))])

    @property
    def rules(self):
        """The rules the normalizer runs, as the options set them."""
        return next(addon for addon in self.addons if isinstance(addon, Normalizer)).rules


class DiagnosedCapture(AddonList):
    def __init__(self, capture: Capture | None = None) -> None:
        chains = ResponseChains()
        self.capture = capture if capture is not None else Capture()
        super().__init__([Normalizer(), DiagnosePrefix(chains), FollowResponseChains(chains), self.capture])
