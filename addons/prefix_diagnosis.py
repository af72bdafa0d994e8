"""The addon that diagnoses each request's prefix, per lane, and says so where the user looks.

Once the request has left, when the upstream answers (its headers, or the
whole answer when no headers came first, or a failure), the request as the
client sent it and as it was forwarded (`normalizer.NormalizedRequest`) go to
the lane's comparison (`diagnosis.PrefixDiagnosis`): a one-line diagnosis in
the log and at the top of `flow.comment`, the flow marked when the prefix
broke, the lane and the diagnosis (JSON) in the flow's notes for `capture.py`.
Made then, it costs the request no latency: the engine is busy prefilling.
A Responses request continuing a stored answer (`previous_response_id`) is
read with the history the server puts in front of it (`response_chains.py`).
`prefix_diagnosis=false` turns it off; the lanes' totals are logged at shutdown.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

from mitmproxy import ctx, http

from stable_prefix.addons.diagnosis import PrefixDiagnosis, PromptSnapshot
from stable_prefix.addons.flow_notes import FLOW_NOTES, client_headers, prepend_comment
from stable_prefix.addons.normalizer import NORMALIZED, NormalizedRequest
from stable_prefix.addons.response_chains import ResponseChains

logger = logging.getLogger(__name__)

OPTION = "prefix_diagnosis"
BROKEN_PREFIX_MARK = ":warning:"


def client_snapshot(result: NormalizedRequest, headers: Mapping[str, str] | None = None) -> PromptSnapshot:
    """The client's prompt (parsed again from the bytes it sent: the rules edited the parsed body in place);
    `headers` name the subagent instance and session."""
    return PromptSnapshot.of(json.loads(result.client_body), result.api, headers)


class DiagnosePrefix:
    """The addon: one diagnosis per normalized request, made when the upstream answers; `chains` are the
    Responses histories the proxy holds (`FollowResponseChains` fills them)."""

    def __init__(self, chains: ResponseChains | None = None) -> None:
        self.diagnosis = PrefixDiagnosis()
        self.chains = chains if chains is not None else ResponseChains()

    def load(self, loader) -> None:
        loader.add_option(OPTION, bool, True, "Log a prefix diagnosis per request and put it in flow.comment.")

    def request(self, flow: http.HTTPFlow) -> None:
        if not getattr(ctx.options, OPTION):
            flow.metadata.pop(NORMALIZED, None)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        self.diagnose(flow)

    def response(self, flow: http.HTTPFlow) -> None:
        self.diagnose(flow)  # an answer without headers first (another addon's): still waiting

    def error(self, flow: http.HTTPFlow) -> None:
        self.diagnose(flow)

    def diagnose(self, flow: http.HTTPFlow) -> None:
        """The diagnosis of a request waiting for it (none waits: nothing)."""
        result = flow.metadata.pop(NORMALIZED, None)
        if result is None:
            return
        client, forwarded, changes = client_snapshot(result, client_headers(flow)), result.body, result.changes
        if result.api == "responses" and isinstance(result.body.get("previous_response_id"), str):
            # The server reads the stored history first: so does the diagnosis (paths shift, no segment reuse).
            client = PromptSnapshot.of(self.chains.resolved(json.loads(result.client_body)), result.api, client_headers(flow))
            forwarded, changes = self.chains.resolved(result.body), None
        self.diagnosis.rules = result.rules
        diagnosis = self.diagnosis.observe(client, forwarded, changes=changes)
        flow.metadata[FLOW_NOTES].update(lane=diagnosis.lane, diagnosis=diagnosis.to_json())
        logger.info(diagnosis.line())
        prepend_comment(flow, diagnosis.line())
        if diagnosis.prefix_broke:
            flow.marked = BROKEN_PREFIX_MARK

    def done(self) -> None:
        for line in self.diagnosis.summary_lines():
            logger.info(line)
