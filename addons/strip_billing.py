"""Keep Claude Code's prompt prefix stable on its way to a self-hosted model.

    mitmdump -s addons/strip_billing.py --mode reverse:http://127.0.0.1:8000 --listen-host 127.0.0.1 -p 8080 \\
        --set upstream_model=<served model name> --set max_tokens_cap=8192

For `POST /v1/messages`, `POST /v1/chat/completions` and `POST /v1/responses`
it applies the rules (`rules/`, one module each: billing header out, git
status, initial and conversation context moved behind the tools, turn
reminders pinned, system and developer messages rewritten, loaded tools
inlined) and what the server needs (`server_compat.py`: model name mapped,
max_tokens capped; `router_compat.py`), through `normalize.py`, and puts a one-line prefix diagnosis per
request into the log and into `flow.comment` (marking the flow when the prefix
broke). The diagnosis is made once the request has left, when the upstream
answers (or fails), so it costs the request no latency: the engine is busy
prefilling by then. Anthropic's own hosts, other paths, and bodies it cannot read go
through byte for byte; as a forward proxy with `anthropic_engine` set, Anthropic's
hosts are answered by the engine instead (`forward_proxy.py`). Server-sent events are streamed, not buffered. When the
engine cannot be reached or breaks off a stream, the client gets an error in
its protocol's shape (`engine_errors.py`), unless the stream is a chat
completion, which the proxy completes (`stream_recovery.py`, its own addon in
this script). For the Responses API it follows each
answer as it passes (its id and output items), so that a later request
continuing it (`previous_response_id`) is diagnosed with the history the server
puts in front of it (`response_chains.py`).

Conventions for the addons in this folder:
- `mitmdump -s addons/x.py` loads a file as a script; it imports its siblings
  as `stable_prefix.addons.*` (the same modules tests import), which `make
  setup` installs into the venv (editable).
- Hooks are small; the logic lives in plain functions tested directly.
- Options are declared in `load()`, parsed in `configure()`; a bad value raises
  OptionsError naming the option and the value. Each is written beside the
  code that reads it: a rule's in its record (`rules/`), the others in their
  modules (`server_compat.OPTIONS`, `engine_errors.declare_option`, ...); this
  script declares the rest.
- What this addon learned about a flow is in `flow.metadata["stable_prefix"]`
  (`request_body.FLOW_NOTES`): api, client_body (bytes as sent), changes,
  lane, diagnosis (JSON); `capture.py` reads it.
- Notes for the user go to the log and are appended to `flow.comment`.
"""

from __future__ import annotations

import json
import logging
import re

from mitmproxy import ctx, exceptions, http

from stable_prefix.addons import engine_errors, exposure, forward_proxy, normalize, router_compat, rules, server_compat
from stable_prefix.addons.diagnosis import PrefixDiagnosis, PromptSnapshot
from stable_prefix.addons.lanes import ROUTING_KEY_SCOPES, routing_key
from stable_prefix.addons.llama_slots import LlamaSlots
from stable_prefix.addons.request_body import CLIENT_ROUTING_HEADERS, FLOW_NOTES, UnreadItems, client_headers, normalize_request
from stable_prefix.addons.response_chains import ResponseChains
from stable_prefix.addons.sse_events import EventStream
from stable_prefix.addons.stream_recovery import StreamRecovery

logger = logging.getLogger(__name__)

BROKEN_PREFIX_MARK = ":warning:"
# An HTTP header name (RFC 9110 token).
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# flow.metadata key of a request whose diagnosis waits for the upstream's answer.
PENDING_DIAGNOSIS = "stable_prefix_pending"


def is_event_stream(response: http.Response) -> bool:
    return response.headers.get("content-type", "").lower().startswith("text/event-stream")


def append_comment(flow: http.HTTPFlow, line: str) -> None:
    flow.comment = f"{flow.comment}\n{line}" if flow.comment else line


def prepend_comment(flow: http.HTTPFlow, line: str) -> None:
    flow.comment = f"{line}\n{flow.comment}" if flow.comment else line


def rules_from_options(options) -> normalize.Rules:
    """The rules as the options set them; raises OptionsError naming a bad value."""
    switches = {rule.option.name: getattr(options, rule.option.name) for rule in rules.RULES}
    return normalize.Rules(**switches, **server_compat.settings_from_options(options),
                           strict_router_body=getattr(options, router_compat.OPTION.name))


def routing_headers_from_option(value: str) -> tuple[str, ...]:
    """The header names of `lane_routing_header` (comma-separated); raises OptionsError naming a bad one."""
    names = tuple(name.strip() for name in value.split(",") if name.strip())
    for name in names:
        if not _HEADER_NAME.fullmatch(name):
            raise exceptions.OptionsError(f"lane_routing_header={value!r}: {name!r} is not an HTTP header name")
    return names


class StripBilling:
    def __init__(self) -> None:
        self.rules = normalize.Rules()
        self.anthropic_engine: forward_proxy.Engine | None = None
        self.routing_headers: tuple[str, ...] = ()
        self.diagnosis = PrefixDiagnosis()
        self.unread_items = UnreadItems()
        self.chains = ResponseChains()
        # Responses answers being streamed, by flow id (flow.metadata must stay serializable).
        self.answers: dict[str, EventStream] = {}

    def load(self, loader) -> None:
        for option in (*(rule.option for rule in rules.RULES), *server_compat.OPTIONS, router_compat.OPTION):
            option.declare(loader)
        loader.add_option("prefix_diagnosis", bool, True, "Log a prefix diagnosis per request and put it in flow.comment.")
        loader.add_option(
            "lane_routing_header", str, "",
            "Add this header (or these, comma-separated) to forwarded requests, holding a stable key of the request's lane "
            "(32 hex digits: a hash of its system text, tools and leading context), for routers that keep a key on one "
            "replica; e.g. x-smg-routing-key (smg, HAProxy) or x-session-id (vllm-router). Empty: off.",
        )
        loader.add_option(
            "routing_key_scope", str, "head",
            "What the routing key names: head (system, tools and leading context: all lanes of a user, project and day "
            "that share a head, a fan-out's instances together) or lane (each subagent instance a key of its own).",
        )
        forward_proxy.declare_option(loader)
        exposure.declare_option(loader)

    def configure(self, updated) -> None:
        self.rules = rules_from_options(ctx.options)
        self.diagnosis.rules = self.rules
        self.anthropic_engine = forward_proxy.engine_from_options(ctx.options)
        self.routing_headers = routing_headers_from_option(ctx.options.lane_routing_header)
        if ctx.options.routing_key_scope not in ROUTING_KEY_SCOPES:
            raise exceptions.OptionsError(f"routing_key_scope={ctx.options.routing_key_scope!r}: not one of {', '.join(ROUTING_KEY_SCOPES)}")

    def running(self) -> None:
        exposure.warn_if_exposed(ctx.options)

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error or not flow.live:
            return
        if self.anthropic_engine is not None and forward_proxy.send_to_engine(flow.request, self.anthropic_engine):
            refused = forward_proxy.keep_threads_off(flow.request)
            if refused:
                flow.response = forward_proxy.refusal(refused)
                flow.metadata[FLOW_NOTES] = {"answered_by_proxy": "a message-thread continue (the engine holds no threads)"}
                append_comment(flow, f"refused: {flow.metadata[FLOW_NOTES]['answered_by_proxy']}")
                return
        result = normalize_request(flow.request, self.rules, self.unread_items)
        if result is None:
            return
        notes = {"api": result.api, "client_body": result.client_body, "changes": [str(change) for change in result.changes]}
        if result.changes:
            append_comment(flow, "normalized: " + "; ".join(notes["changes"]))
        flow.metadata[FLOW_NOTES] = notes
        strict = [change for change in result.changes if change.rule == router_compat.STRICT_ROUTER]
        if strict:
            logger.info(f"{router_compat.OPTION.name}: " + "; ".join(map(str, strict)))
        if self.routing_headers:
            key = routing_key(result.body, result.api, flow.request.headers, ctx.options.routing_key_scope)
            # The diagnosis reads the client's own headers (opencode names its sessions in x-session-id).
            flow.metadata[CLIENT_ROUTING_HEADERS] = {name: flow.request.headers.get(name) for name in self.routing_headers}
            for name in self.routing_headers:
                flow.request.headers[name] = key
        if ctx.options.prefix_diagnosis:
            flow.metadata[PENDING_DIAGNOSIS] = result

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        follows_answer = self.diagnose(flow) == "responses"
        # Without this mitmproxy buffers the whole answer (and swallows SSE).
        if flow.response and is_event_stream(flow.response):
            if follows_answer:
                flow.response.stream = self._follow_answer(flow, flow.response.stream)
            elif not flow.response.stream:
                flow.response.stream = True

    def response(self, flow: http.HTTPFlow) -> None:
        """A Responses answer is complete: hold its history for a request that continues it."""
        answer = self.answers.pop(flow.id, None)
        if flow.metadata.get(FLOW_NOTES, {}).get("api") != "responses" or flow.response is None or flow.response.status_code != 200:
            return
        try:
            forwarded = json.loads(flow.request.get_content(strict=False) or b"")
            response = answer.response if answer is not None else json.loads(flow.response.get_content(strict=False) or b"")
        except ValueError:
            return
        if isinstance(forwarded, dict) and isinstance(response, dict):
            self.chains.remember(forwarded, response)

    def error(self, flow: http.HTTPFlow) -> None:
        self.answers.pop(flow.id, None)
        self.diagnose(flow)

    def _follow_answer(self, flow: http.HTTPFlow, previous):
        """A stream callable that reads the events as the server sent them and
        passes each chunk on (through `previous`, another addon's, if any)."""
        answer = self.answers[flow.id] = EventStream()
        previous = previous if callable(previous) else None

        def follow(chunk: bytes):
            answer.feed(chunk)
            return previous(chunk) if previous else chunk

        return follow

    def diagnose(self, flow: http.HTTPFlow) -> str | None:
        """The diagnosis of a request waiting for it; returns the request's API (None: none waited)."""
        result = flow.metadata.pop(PENDING_DIAGNOSIS, None)
        if result is None:
            return None
        client, forwarded, changes = result.client_snapshot(client_headers(flow)), result.body, result.changes
        if result.api == "responses" and isinstance(result.body.get("previous_response_id"), str):
            # The server reads the stored history first: so does the diagnosis (paths shift, no segment reuse).
            client = PromptSnapshot.of(self.chains.resolved(json.loads(result.client_body)), result.api, client_headers(flow))
            forwarded, changes = self.chains.resolved(result.body), None
        diagnosis = self.diagnosis.observe(client, forwarded, changes=changes)
        flow.metadata[FLOW_NOTES].update(lane=diagnosis.lane, diagnosis=diagnosis.to_json())
        logger.info(diagnosis.line())
        prepend_comment(flow, diagnosis.line())
        if diagnosis.prefix_broke:
            flow.marked = BROKEN_PREFIX_MARK
        return result.api

    def done(self) -> None:
        for line in self.diagnosis.summary_lines():
            logger.info(line)


# StreamRecovery after StripBilling: it follows the streams StripBilling turned on, and wraps what engine_errors installs.
# LlamaSlots after StripBilling: it pins the body StripBilling normalized (off unless llama_slots is set).
addons = [StripBilling(), LlamaSlots(), StreamRecovery(), engine_errors.EngineErrors()]
