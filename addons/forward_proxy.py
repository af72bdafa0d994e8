"""A forward proxy in front of a self-hosted engine: Anthropic's hosts answered by the engine.

Many people run mitmproxy as a forward proxy (`HTTPS_PROXY=http://127.0.0.1:8080`, its CA trusted
through NODE_EXTRA_CA_CERTS) and set no ANTHROPIC_BASE_URL. Claude Code then believes it talks to
Anthropic's own API: it sends the first-party billing fields (`cch`, `cc_prev_req`, ...; the
billing rule strips every form) and, where its Message Threads gate is on, server-side threads
(Claude Code 2.1.332, read from the real CLI): the beta `message-threads-2026-08-12`, a
`"thread": {"type": "create"}` on a conversation's first request, and then follow-ups of
`"thread": {"type": "continue", "previous_message_id": ...}` whose `messages` hold only what is
new and which leave `system` and `tools` out. No self-hosted engine holds that history. The gate
is the client's: on only against Anthropic's host (a custom ANTHROPIC_BASE_URL turns it off for
the session), then by a feature flag of Anthropic's (off by default) or CLAUDE_CODE_TETHER_LIVE=1.

With `anthropic_engine=http://127.0.0.1:8000` (mitmdump `--mode regular`) every request for an
Anthropic host goes to that engine instead, and nothing reaches Anthropic; the rules then run on it
as on any other request. Threads are kept off where the client can be told:
- the `message-threads-*` beta leaves `anthropic-beta`, and a `create` loses its `thread` field:
  the engine gets a whole, ordinary request;
- a `continue`, which the engine cannot answer, is answered here with a 400 in Anthropic's shape
  that says why; Claude Code's own answer to a 400 on a thread request is to send the same turn
  again stateless, whole, and to keep that thread stateless for the session.
Without the option, requests to Anthropic's hosts pass through untouched, as before.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from urllib.parse import urlsplit

from mitmproxy import ctx, exceptions, http

from stable_prefix.addons import engine_errors
from stable_prefix.addons.flow_notes import FLOW_NOTES, append_comment
from stable_prefix.addons.request_body import LeftAlone, is_anthropic_host, read_json_body, write_json_body

logger = logging.getLogger(__name__)

OPTION = "anthropic_engine"
THREADS_BETA_PREFIX = "message-threads-"
CONTINUE_REFUSAL = (
    "stable-prefix proxy: this request continues a server-side message thread (\"thread\": {\"type\": \"continue\"}), "
    "which leaves system, tools and the earlier messages to the server; the self-hosted engine holds no threads, so it "
    "was not forwarded. Send the whole conversation (Claude Code does so after this error). To keep threads off from "
    "the start, set ANTHROPIC_BASE_URL to this proxy instead of HTTPS_PROXY."
)


@dataclass(frozen=True)
class Engine:
    scheme: str
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"


def engine_from_options(options) -> Engine | None:
    """The engine the option names, or None; raises OptionsError naming a bad value."""
    value = getattr(options, OPTION)
    try:
        return parse_engine(value)
    except ValueError as error:
        raise exceptions.OptionsError(f"{OPTION}={value!r}: {error}") from error


def parse_engine(value: str) -> Engine | None:
    """The engine an option names (`http://127.0.0.1:8000`); None when empty; ValueError saying what is wrong."""
    if not value.strip():
        return None
    parts = urlsplit(value.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("expected an http:// or https:// URL with a host, e.g. http://127.0.0.1:8000")
    if parts.path not in ("", "/") or parts.query:
        raise ValueError("expected the engine's address only, without a path (its /v1/... paths come from the request)")
    return Engine(parts.scheme, parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))


def send_to_engine(request: http.Request, engine: Engine) -> bool:
    """Point a request for an Anthropic host at the engine; False (untouched) for any other host."""
    if not is_anthropic_host(request):
        return False
    request.scheme, request.host, request.port = engine.scheme, engine.host, engine.port
    request.headers["host"] = f"{engine.host}:{engine.port}"
    return True


def without_threads_beta(beta: str) -> str:
    """`anthropic-beta` without the message-threads beta (a comma-separated list)."""
    return ",".join(token for token in (t.strip() for t in beta.split(",")) if token and not token.startswith(THREADS_BETA_PREFIX))


def keep_threads_off(request: http.Request) -> str | None:
    """Take the thread out of a request bound for the engine: the refusal for a `continue`, else
    None (forward it, the beta and a `create` taken out)."""
    beta = request.headers.get("anthropic-beta")
    if beta is not None and THREADS_BETA_PREFIX in beta:
        kept = without_threads_beta(beta)
        if kept:
            request.headers["anthropic-beta"] = kept
        else:
            del request.headers["anthropic-beta"]
    if engine_errors.protocol_of(request.path) != "anthropic" or request.method != "POST":
        return None
    body = read_json_body(request)
    if isinstance(body, LeftAlone) or "thread" not in body:
        return None
    thread = body["thread"]
    if isinstance(thread, dict) and thread.get("type") == "continue":
        logger.warning(f"{request.method} {request.path}: a message-thread continue; answered 400 (the engine holds no threads)")
        return CONTINUE_REFUSAL
    del body["thread"]
    write_json_body(request, body)
    logger.info(f"{request.method} {request.path}: its message thread ({json.dumps(thread)[:80]}) removed; forwarded whole")
    return None


def refusal(message: str) -> http.Response:
    """A 400 in Anthropic's error shape, as the API answers a request it will not take."""
    body = {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    return http.Response.make(400, json.dumps(body).encode(), {"content-type": "application/json"})


class ForwardProxy:
    """The addon: with `anthropic_engine` set, a request for an Anthropic host goes to the engine, its thread kept
    off; a thread's `continue` is answered here (the addons after it then leave the flow alone)."""

    def __init__(self) -> None:
        self.engine: Engine | None = None

    def load(self, loader) -> None:
        loader.add_option(
            OPTION, str, "",
            "As a forward proxy (--mode regular, the client's HTTPS_PROXY, no ANTHROPIC_BASE_URL): send every request for "
            "Anthropic's hosts to this engine instead (e.g. http://127.0.0.1:8000), with message threads kept off; nothing "
            "reaches Anthropic. Empty: requests to Anthropic's hosts pass through untouched.",
        )

    def configure(self, updated) -> None:
        self.engine = engine_from_options(ctx.options)

    def request(self, flow: http.HTTPFlow) -> None:
        if self.engine is None or flow.response or flow.error or not flow.live or not send_to_engine(flow.request, self.engine):
            return
        refused = keep_threads_off(flow.request)
        if refused:
            flow.response = refusal(refused)
            flow.metadata[FLOW_NOTES] = {"answered_by_proxy": "a message-thread continue (the engine holds no threads)"}
            append_comment(flow, f"refused: {flow.metadata[FLOW_NOTES]['answered_by_proxy']}")
