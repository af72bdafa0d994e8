"""Warn when the proxy listens beyond this machine.

mitmproxy listens on every interface unless `--listen-host` says otherwise, so
anyone on the same network could use the model through the proxy and fill the
capture folder with their requests (which hold the user's code and prompts).
The scripts that see requests call `warn_if_exposed()` once the proxy runs;
the warning is logged once per process, and `expose_proxy=true` says the
exposure is intended (a team's shared proxy behind its own firewall).
"""

from __future__ import annotations

import ipaddress
import logging

from mitmproxy import ctx
from mitmproxy.proxy.mode_specs import ProxyMode

logger = logging.getLogger(__name__)

OPTION = "expose_proxy"
OPTION_HELP = (
    "Set when the proxy is meant to listen on a non-loopback address (other machines may then use the model and "
    "fill the capture folder); silences the warning logged at start."
)
_warned = False  # both strip_billing.py and capture.py call in; one warning is enough


def declare_option(loader) -> None:
    """Both scripts declare it (identically, which mitmproxy allows), so either works alone."""
    loader.add_option(OPTION, bool, False, OPTION_HELP)


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # "" (every interface) or a host name that may resolve anywhere


def exposed_addresses(options) -> list[str]:
    """Where the proxy (and mitmweb's UI, which shows every flow) listens beyond loopback."""
    exposed = []
    for spec in options.mode:
        host = ProxyMode.parse(spec).listen_host(options.listen_host)
        if not is_loopback(host):
            exposed.append(f"proxy {spec!r} on {host or 'every interface'}")
    web_host = getattr(options, "web_host", None)  # only mitmweb has it
    if web_host is not None and not is_loopback(web_host):
        exposed.append(f"mitmweb's UI on {web_host or 'every interface'}")
    return exposed


def warn_if_exposed(options) -> None:
    global _warned
    if _warned or getattr(options, OPTION, False):
        return
    exposed = exposed_addresses(options)
    if exposed:
        _warned = True
        logger.warning(
            "listening beyond this machine: " + "; ".join(exposed) + ". Anyone who can reach it can use the model and "
            "fill the capture folder with their requests. Bind to loopback with --listen-host 127.0.0.1 (and "
            f"--set web_host=127.0.0.1), or --set {OPTION}=true if that is intended."
        )


class ExposureWarning:
    """The addon, for a script whose requests hold the user's code: the warning once the proxy runs."""

    def load(self, loader) -> None:
        declare_option(loader)

    def running(self) -> None:
        warn_if_exposed(ctx.options)
