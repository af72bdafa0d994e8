"""`python -m stable_prefix.captures diff|report` on capture records and raw request bodies."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mitmproxy import http
from mitmproxy.test import taddons, tflow, tutils

from stable_prefix.addons.capture import Capture
from stable_prefix.captures.cli import main
from tests.fixtures import claude_code
from tests.support.proxy_addons import ProxyAddons

REPO = Path(__file__).resolve().parents[2]


def write(path, document):
    path.write_text(json.dumps(document))
    return str(path)


def run(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def captured_session(directory, bodies):
    """Records written by the real addons, as a mitmdump session would;
    `bodies` holds request bodies or (body, extra headers) pairs."""
    capture, strip = Capture(), ProxyAddons()
    with taddons.context(strip, capture) as tctx:
        tctx.configure(capture, capture_dir=str(directory), capture_session="s")
        for item in bodies:
            body, extra = item if isinstance(item, tuple) else (item, {})
            headers = http.Headers(((b"content-type", b"application/json"), *((k.encode(), v.encode()) for k, v in extra.items())))
            request = tutils.treq(host="127.0.0.1", method=b"POST", path=b"/v1/messages?beta=true", headers=headers, content=json.dumps(body).encode())
            flow = tflow.tflow(req=request)
            strip.request(flow)
            capture.request(flow)
            flow.response = tutils.tresp(headers=http.Headers(((b"content-type", b"application/json"),)), content=b'{"usage": {"input_tokens": 9, "cache_read_input_tokens": 1500}}')
            strip.responseheaders(flow)  # the answer's headers: the diagnosis is made
            capture.response(flow)
    return directory / "s"


SESSION = [
    claude_code.title_request(),
    claude_code.main_request(2, cch="a1"),
    claude_code.subagent_request("explore", 1),
    claude_code.main_request(3, cch="a2"),
    claude_code.subagent_request("explore", 2, billing_suffix="b99"),
    claude_code.main_request(1, git_status="?? notes.txt", topic="other work", cch="a3"),
]


# --- diff ---------------------------------------------------------------------


def test_diff_of_raw_bodies_shows_the_billing_break_and_the_changed_paths(tmp_path, capsys):
    a = write(tmp_path / "a.json", claude_code.main_request(3, cch="11111"))
    b = write(tmp_path / "b.json", claude_code.main_request(4, cch="22222"))
    status, out, _ = run(capsys, "diff", a, b)
    assert status == 0
    assert "lane main · prefix broke at system[0].text byte " in out
    assert "(billing header; strip_billing_header off)" in out
    assert '  ~ system[0].text  …' in out and "cch=11111" in out and "cch=22222" in out
    assert "  + messages[6]" in out and "  + messages[7]" in out
    assert "cache_control" not in out.split("changed paths")[1].split("\n", 1)[1]


def test_diff_normalized_shows_what_the_backend_sees(tmp_path, capsys):
    a = write(tmp_path / "a.json", claude_code.main_request(3, cch="11111"))
    b = write(tmp_path / "b.json", claude_code.main_request(4, cch="22222"))
    status, out, _ = run(capsys, "diff", a, b, "--normalized")
    assert status == 0
    assert "lane main · prefix stable " in out and "first change messages[6]" in out
    assert "raw broke at system[0].text" in out and "(billing header; stripped)" in out
    assert "system[0].text" not in out.split("changed paths")[1]


def test_diff_json_has_the_promised_fields(tmp_path, capsys):
    a = write(tmp_path / "a.json", claude_code.main_request(3, cch="11111"))
    b = write(tmp_path / "b.json", claude_code.main_request(4, cch="22222"))
    status, out, _ = run(capsys, "diff", a, b, "--json")
    result = json.loads(out)
    assert status == 0 and result["lane"] == "main"
    assert result["first_divergence"]["path"] == "system[0].text"
    assert result["first_divergence"]["byte_offset"] == result["stable_prefix_bytes"]
    assert result["total_bytes"] > result["stable_prefix_bytes"]
    assert result["stable_prefix_ratio"] == round(result["stable_prefix_bytes"] / result["total_bytes"], 6)
    assert result["explained_by"] == "billing_header"
    assert result["changed_paths"] == ["system[0].text", "messages[6]", "messages[7]"]


def test_diff_of_capture_records(tmp_path, capsys):
    session = captured_session(tmp_path, SESSION[:4])
    first_main, second_main = sorted(session.glob("*-main.json"))
    status, out, _ = run(capsys, "diff", str(first_main), str(second_main), "--json")
    result = json.loads(out)
    assert status == 0 and result["explained_by"] == "billing_header"  # the client bodies differ there
    assert result["changed_paths"][0] == "system[0].text"


def test_diff_warns_when_the_two_requests_are_different_lanes(tmp_path, capsys):
    a = write(tmp_path / "a.json", claude_code.main_request())
    b = write(tmp_path / "b.json", claude_code.subagent_request())
    _, out, _ = run(capsys, "diff", a, b)
    assert "warning: different lanes (main vs sub:" in out


# --- report -------------------------------------------------------------------


def test_report_pairs_consecutive_requests_per_lane(tmp_path, capsys):
    session = captured_session(tmp_path, SESSION)
    status, out, _ = run(capsys, "report", str(session), "--json")
    result = json.loads(out)
    assert status == 0 and result["requests"] == 6
    lanes = [pair["lane"] for pair in result["pairs"]]
    assert lanes[0] == lanes[2] == "main" and lanes[1].startswith("sub:")  # the title request has no pair
    by_current = {Path(pair["current"]).name: pair for pair in result["pairs"]}
    kept, cleared = by_current["0004-main.json"], by_current["0006-main.json"]
    assert Path(kept["previous"]).name == "0002-main.json"
    assert kept["prefix_kept"] and kept["neutralized"]["rule"] == "billing_header"
    assert kept["changed_paths"] == ["messages[4]", "messages[5]"]
    assert kept["usage"]["cache_read_input_tokens"] == 1500
    assert not cleared["prefix_kept"] and cleared["explained_by"] is None
    for pair in result["pairs"]:
        assert {"lane", "first_divergence", "stable_prefix_bytes", "total_bytes", "stable_prefix_ratio", "explained_by", "changed_paths"} <= set(pair)
    assert result["lanes"]["main"]["requests"] == 3


def test_report_table_lists_each_pair_and_the_lane_totals(tmp_path, capsys):
    session = captured_session(tmp_path, SESSION)
    status, out, _ = run(capsys, "report", str(session))
    assert status == 0
    lines = out.splitlines()
    assert lines[1].split() == ["request", "lane", "prefix", "stable/total", "B", "ratio", "first", "divergence", "cause", "cached", "changed"]
    row = next(line for line in lines if line.startswith("0004-main"))
    assert " kept " in row and "raw: billing header; stripped" in row and "1,500" in row
    assert "broke" in next(line for line in lines if line.startswith("0006-main"))
    assert any(line.strip().startswith("lane main · 3 requests · prefix kept 1/2") for line in lines)


def test_report_of_raw_bodies_compares_them_as_the_rules_would_forward_them(tmp_path, capsys):
    for index, body in enumerate(SESSION):
        write(tmp_path / f"{index:02d}.json", body)
    status, out, _ = run(capsys, "report", str(tmp_path), "--json")
    pairs = json.loads(out)["pairs"]
    assert status == 0 and [p["prefix_kept"] for p in pairs if p["lane"] == "main"] == [True, False]


TODAYS_SESSION = [
    (claude_code.modern_request(2), claude_code.agent_headers(session="s-1")),
    (claude_code.modern_subagent_request(task="Find the tests."), claude_code.agent_headers("a1111111111", session="s-1")),
    (claude_code.modern_subagent_request(task="Find the docs."), claude_code.agent_headers("b2222222222", session="s-1")),
    (claude_code.modern_subagent_request(task="Find the tests.", turns=2), claude_code.agent_headers("a1111111111", session="s-1")),
    (claude_code.modern_subagent_request(task="Find the docs.", turns=2), claude_code.agent_headers("b2222222222", session="s-1")),
    (claude_code.modern_request(3), claude_code.agent_headers(session="s-1")),
    (claude_code.compacted_request(), claude_code.agent_headers(session="s-1")),
    (claude_code.modern_request(1, prompt="Other work."), claude_code.agent_headers(session="s-2")),
]


def test_report_names_the_cause_of_every_break_and_counts_them_per_lane(tmp_path, capsys):
    session = captured_session(tmp_path, TODAYS_SESSION)
    status, out, _ = run(capsys, "report", str(session), "--json")
    result = json.loads(out)
    causes = {Path(pair["current"]).name: pair["cause"] for pair in result["pairs"]}
    assert status == 0 and causes["0007-main.json"] == "compaction" and causes["0008-main.json"] == "new conversation"
    assert causes["0006-main.json"] is None  # kept
    assert result["lanes"]["main"]["breaks"] == {"compaction": 1, "new conversation": 1}
    instance_lanes = [lane for lane in result["lanes"] if "@" in lane]
    assert len(instance_lanes) == 2 and all(result["lanes"][lane]["prefix_kept"] == 1 for lane in instance_lanes)
    [(group, total)] = result["groups"].items()
    assert instance_lanes[0].startswith(group + "@") and total["instances"] == 2 and total["prefix_broke"] == 0


def test_report_table_shows_the_cause_and_the_instances_group(tmp_path, capsys):
    session = captured_session(tmp_path, TODAYS_SESSION)
    _, out, _ = run(capsys, "report", str(session))
    assert "compaction" in next(line for line in out.splitlines() if line.startswith("0007-main"))
    assert "new conversation" in next(line for line in out.splitlines() if line.startswith("0008-main"))
    assert any(line.strip().startswith("lanes sub:") and "· 2 instances · 4 requests · prefix kept 2/2" in line for line in out.splitlines())


# --- bad input ----------------------------------------------------------------


@pytest.mark.parametrize(
    "content, message",
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "a JSON list, expected a capture record or a request body"),
        (b'{"model": "x"}', 'neither a capture record (no "format"'),
        (json.dumps({"format": "stable-prefix capture 1", "client_body_text": "x", "forwarded_body_text": "x"}).encode(), "request body was not a JSON object"),
    ],
)
def test_bad_input_files_are_named_with_the_problem(tmp_path, capsys, content, message):
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    good = write(tmp_path / "good.json", claude_code.main_request())
    status, out, err = run(capsys, "diff", good, str(bad))
    assert status == 2 and out == ""
    assert err.startswith(f"error: {bad}: ") and message in err


def test_missing_file_is_an_error(tmp_path, capsys):
    status, _, err = run(capsys, "diff", str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    assert status == 2 and "a.json: cannot read it" in err


def test_report_of_a_folder_without_captures_points_at_the_sessions(tmp_path, capsys):
    captured_session(tmp_path, SESSION[:2])
    status, _, err = run(capsys, "report", str(tmp_path))
    assert status == 2 and "no .json files (sessions in subfolders: s)" in err


def test_report_of_a_file_is_an_error(tmp_path, capsys):
    status, _, err = run(capsys, "report", write(tmp_path / "a.json", {}))
    assert status == 2 and "not a directory" in err


# --- the real command ---------------------------------------------------------


def test_the_committed_examples_run_as_a_module():
    examples = sorted((REPO / "captures" / "examples").glob("*.json"))
    result = subprocess.run([sys.executable, "-m", "stable_prefix.captures", "diff", *map(str, examples), "--normalized"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "lane main · prefix stable" in result.stdout and "(billing header; stripped)" in result.stdout


def test_usage_error_exits_non_zero():
    result = subprocess.run([sys.executable, "-m", "stable_prefix.captures", "diff", "only-one.json"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "usage:" in result.stderr
