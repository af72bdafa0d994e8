"""`python -m stable_prefix.captures diff|report` on Responses API captures, written by the real addons."""

import json

from mitmproxy.test import taddons

from stable_prefix.addons.capture import Capture
from stable_prefix.captures.cli import main
from tests.fixtures import codex
from tests.support.proxy_addons import ProxyAddons
from tests.support.responses_flows import json_answer, response_object, responses_flow


def captured(directory, bodies_and_headers):
    """Each request through strip_billing and capture, answered with a whole response object."""
    capture, strip = Capture(), ProxyAddons()
    with taddons.context(strip, capture) as tctx:
        tctx.configure(capture, capture_dir=str(directory), capture_session="s")
        for number, (body, headers) in enumerate(bodies_and_headers, 1):
            flow = responses_flow(body, headers)
            strip.request(flow)
            capture.request(flow)
            json_answer([strip, capture], flow, response_object(f"resp_{number}"))
    return directory / "s"


def run_json(capsys, *argv):
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_the_report_reads_a_chained_request_with_the_captured_history_and_its_cached_tokens(tmp_path, capsys):
    session = captured(tmp_path, [
        ({"model": "m", "instructions": "Be brief.", "input": "Say hello."}, {}),
        ({"model": "m", "instructions": "Be brief.", "previous_response_id": "resp_1", "input": "In French."}, {}),
    ])
    report = run_json(capsys, "report", str(session), "--json")
    [pair] = report["pairs"]
    assert pair["prefix_kept"] is True and pair["first_divergence"]["path"] == "input[1]"
    assert pair["usage"]["input_tokens_details"]["cached_tokens"] == 880
    assert main(["report", str(session)]) == 0
    assert " 880 " in capsys.readouterr().out  # the cached column


def test_a_diff_of_two_codex_conversations_shows_no_item_ids(tmp_path, capsys):
    one, other = codex.Conversation("Say hello."), codex.Conversation("Say goodbye.")
    session = captured(tmp_path, [(one.request(), one.headers()), (other.request(), other.headers())])
    first, second = sorted(session.glob("*.json"))
    diff = run_json(capsys, "diff", str(first), str(second), "--json")
    assert diff["cause"] == "new conversation"
    assert "input[3].content" in diff["changed_paths"]
    assert not any(path.endswith(".id") for path in diff["changed_paths"]), diff["changed_paths"]
