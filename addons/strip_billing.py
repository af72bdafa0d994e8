"""Keep Claude Code's prompt prefix stable on its way to a self-hosted model.

    mitmdump -s addons/strip_billing.py --mode reverse:http://127.0.0.1:8000 --listen-host 127.0.0.1 -p 8080 \\
        --set upstream_model=<served model name> --set max_tokens_cap=8192

For `POST /v1/messages`, `POST /v1/chat/completions` and `POST /v1/responses`
it applies the rules of `normalize.py` (billing header out, git status,
initial and conversation context moved behind the tools, turn reminders
pinned, system and developer messages rewritten, loaded tools inlined, model
name mapped, max_tokens capped), and puts a one-line prefix diagnosis per
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
  OptionsError naming the option and the value.
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

from stable_prefix.addons import engine_errors, exposure, forward_proxy, normalize
from stable_prefix.addons.diagnosis import PrefixDiagnosis, PromptSnapshot
from stable_prefix.addons.lanes import ROUTING_KEY_SCOPES, routing_key
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
    try:
        model_map = normalize.parse_model_map(options.model_map)
    except ValueError as error:
        raise exceptions.OptionsError(f"model_map={options.model_map!r}: {error}") from error
    if options.upstream_model.strip():
        model_map += (("*", options.upstream_model.strip()),)  # after the patterns: they win
    if options.max_tokens_cap < 0:
        raise exceptions.OptionsError(f"max_tokens_cap={options.max_tokens_cap}: must be 0 (no cap) or a positive number of tokens")
    return normalize.Rules(
        strip_billing_header=options.strip_billing_header,
        rewrite_system_messages=options.rewrite_system_messages,
        relocate_git_status=options.relocate_git_status,
        lead_with_stable_context=options.lead_with_stable_context,
        inline_loaded_tools=options.inline_loaded_tools,
        relocate_conversation_context=options.relocate_conversation_context,
        pin_turn_reminders=options.pin_turn_reminders,
        drop_date_line=options.drop_date_line,
        sort_tools=options.sort_tools,
        model_map=model_map,
        max_tokens_cap=options.max_tokens_cap,
        strict_router_body=options.strict_router_body,
    )


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
        loader.add_option("strip_billing_header", bool, True, "Remove Claude Code's x-anthropic-billing-header from the system prompt.")
        loader.add_option(
            "rewrite_system_messages", bool, True, 'Rewrite role:"system" messages inside messages into user <system-reminder> messages, in place.'
        )
        loader.add_option(
            "relocate_git_status",
            bool,
            True,
            "Move a git status paragraph (a line starting 'gitStatus:' to the end of its block) from the system prompt "
            "into a <system-reminder> at the start of the first user message.",
        )
        loader.add_option(
            "lead_with_stable_context",
            bool,
            True,
            'Move role:"system" messages that come before any assistant message (initial context, e.g. the environment) '
            "to just before the first user message, as user <system-reminder> messages.",
        )
        loader.add_option(
            "inline_loaded_tools",
            bool,
            True,
            "Take a deferred tool that a tool_reference loaded (ToolSearch) out of tools and write its schema into the "
            "tool result that loaded it, so tools stays what the conversation started with.",
        )
        loader.add_option(
            "relocate_conversation_context",
            bool,
            True,
            "Move system-prompt text that changes between conversations (opencode's Today's date line, Qwen Code's git "
            "snapshot and memory section) and Qwen Code's startup context into the first user message, after the "
            "reminders it starts with.",
        )
        loader.add_option(
            "pin_turn_reminders",
            bool,
            True,
            "Move a reminder the agent puts on its newest user message for one request only (Qwen Code's current date, "
            "opencode's plan-mode and switch-to-build reminders) to the first user message, after the reminders it starts with.",
        )
        loader.add_option("drop_date_line", bool, False, "Remove a \"Today's date is ...\" line from the system prompt.")
        loader.add_option("sort_tools", bool, False, "Sort the tool definitions by name.")
        loader.add_option("upstream_model", str, "", "Send every request with this model name (the name the server serves).")
        loader.add_option(
            "model_map",
            str,
            "",
            "Map requested model names: comma-separated pattern=name pairs, shell patterns, first match wins, "
            "e.g. 'claude-*haiku*=small-model,claude-*=big-model'. Checked before upstream_model.",
        )
        loader.add_option("max_tokens_cap", int, 0, "Lower max_tokens (and max_completion_tokens) to at most this; 0: no cap.")
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
        loader.add_option(
            "strict_router_body", bool, False,
            "Make bodies what a router with a strict schema (smg) accepts, dropping only fields vllm-mlx ignores: "
            "an Anthropic message's fields besides role and content (Claude Code's output_config), thinking whose "
            "budget_tokens is not below max_tokens, a Responses request's fields smg refuses and the engine ignores (Codex's "
            "client_metadata); a Responses request without temperature gets the engine's default (smg would set 1.0). Each drop is logged. For a team's proxy before smg; off: bodies as the rules leave them.",
        )
        loader.add_option(
            engine_errors.OPTION, bool, True,
            "When the engine cannot be reached, answer with a 502 JSON error in the request's protocol; when it breaks off "
            "a streamed answer, end the stream with the protocol's SSE error event (mitmproxy: an HTML page, a cut stream).",
        )
        loader.add_option(
            forward_proxy.OPTION, str, "",
            "As a forward proxy (--mode regular, the client's HTTPS_PROXY, no ANTHROPIC_BASE_URL): send every request for "
            "Anthropic's hosts to this engine instead (e.g. http://127.0.0.1:8000), with message threads kept off; nothing "
            "reaches Anthropic. Empty: requests to Anthropic's hosts pass through untouched.",
        )
        exposure.declare_option(loader)
        engine_errors.install()

    def configure(self, updated) -> None:
        self.rules = rules_from_options(ctx.options)
        self.diagnosis.rules = self.rules
        try:
            self.anthropic_engine = forward_proxy.parse_engine(getattr(ctx.options, forward_proxy.OPTION))
        except ValueError as error:
            raise exceptions.OptionsError(f"{forward_proxy.OPTION}={getattr(ctx.options, forward_proxy.OPTION)!r}: {error}") from error
        self.routing_headers = routing_headers_from_option(ctx.options.lane_routing_header)
        if ctx.options.routing_key_scope not in ROUTING_KEY_SCOPES:
            raise exceptions.OptionsError(f"routing_key_scope={ctx.options.routing_key_scope!r}: not one of {', '.join(ROUTING_KEY_SCOPES)}")

    def running(self) -> None:
        exposure.warn_if_exposed(ctx.options)
        if getattr(ctx.options, engine_errors.OPTION) and getattr(ctx.options, "connection_strategy", None) == "eager":
            # Eagerly, a client that connects while the engine is down is cut off before it sends a request,
            # so there is nothing to answer; lazily, the request comes first and gets its 502.
            ctx.options.update(connection_strategy="lazy")
            logger.info(f"connection_strategy=lazy: a request while the engine is down gets an answer ({engine_errors.OPTION})")

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
        strict = [change for change in result.changes if change.rule == normalize.STRICT_ROUTER]
        if strict:
            logger.info("strict_router_body: " + "; ".join(map(str, strict)))
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
addons = [StripBilling(), StreamRecovery()]
