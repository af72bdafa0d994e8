"""The session page: a capture folder read per lane (reuse as the server said, the breaks the proxy diagnosed,
`diff`'s changed paths), drawn as one self-contained page; `report --html`; the live page the proxy serves.
Folders are written by the real addons (`tests/support/capture_sessions.py`). The browser's view of the page
is `test_session_page_browser.py`."""

import asyncio
import json
import shutil
from pathlib import Path

import pytest
from mitmproxy.proxy.mode_specs import ProxyMode
from mitmproxy.test import taddons, tflow, tutils

from stable_prefix.addons.capture import Capture
from stable_prefix.addons.session_page import PAGE_PATH, SessionPage
from stable_prefix.bench.clients.capture_in_process import Exchange, write_session
from stable_prefix.captures.cli import main
from stable_prefix.captures.session import COLD, KEPT, SessionReader, read_session
from stable_prefix.captures.session_html import BREAK, PREFILLED, REUSED, render
from stable_prefix.servers import Server
from stable_prefix.stack import PROXY_SCRIPTS, StackOptions, print_ready
from tests.fixtures import claude_code
from tests.support.capture_sessions import scripted_session

SCRIPT = Path(__file__).resolve().parents[2] / "addons" / "session_page.py"
BREAK_SEQ = 8  # the main lane's 5th request: records 1-7 interleave 4 main and 3 subagent requests


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return scripted_session(tmp_path_factory.mktemp("capture"), main_turns=8, break_at=5, subagent_turns=3)


@pytest.fixture(scope="module")
def session(folder):
    return read_session(folder)


# --- the session, per lane ------------------------------------------------------------------------------


def test_each_lane_holds_its_requests_in_order_with_the_servers_reuse(session):
    assert list(session.lanes) == ["main", "sub:d0881b"]
    main = session.lanes["main"]
    assert [bar.seq for bar in main] == [1, 3, 5, 7, 8, 9, 10, 11]
    assert (main[0].prompt_tokens, main[0].reused_tokens, main[0].prefilled_tokens) == (550, 0, 550)
    assert (main[1].prompt_tokens, main[1].reused_tokens, main[1].prefilled_tokens) == (700, 550, 150)
    assert main[0].first_in_lane and not main[1].first_in_lane
    assert main[1].ttft_s == pytest.approx(0.125, abs=0.01)


def test_the_scripted_break_carries_the_proxys_cause_and_byte_and_diffs_changed_paths(session):
    (broke,) = session.breaks
    assert broke.seq == BREAK_SEQ and broke.lane == "main"
    assert broke.broke.cause == "new conversation"
    assert broke.broke.where == f"messages[1].content[0].text byte {broke.broke.byte_offset:,}"
    assert broke.broke.previous.name == "0007-main.json"
    assert broke.broke.diff_lines[0].startswith("changed paths")
    assert any(line.startswith("  ~ messages[1].content[0].text") and "notes.txt" in line for line in broke.broke.diff_lines)


def test_reuse_the_server_did_not_report_is_unknown_never_zero(tmp_path):
    folder = write_session(tmp_path, [Exchange(claude_code.main_request(1), None, 0.2),
                                      Exchange(claude_code.main_request(2), {"input_tokens": 900, "output_tokens": 2}, 0.3)])
    first, second = read_session(folder).lanes["main"]
    assert (first.prompt_tokens, first.reused_tokens, first.prefilled_tokens) == (None, None, None)
    assert (second.prompt_tokens, second.reused_tokens, second.prefilled_tokens) == (900, None, None)
    assert read_session(folder).totals()["reuse_unknown"] == 2
    page = render(read_session(folder))
    assert 'fill="url(#unknown)"' in page and f'fill="{REUSED}"' not in page and f'fill="{PREFILLED}"' not in page


def test_the_prefill_rate_is_the_slope_of_ttft_over_prefilled_tokens_so_fixed_time_is_not_prefill(session):
    rate = session.prefill_rate()  # scripted: TTFT = 50 ms + 0.5 ms per token prefilled
    assert rate.method == "slope" and rate.requests == 11
    assert rate.tokens_per_s == pytest.approx(2000, rel=0.02)
    assert rate.fixed_s == pytest.approx(0.05, abs=0.005)
    assert rate.seconds_for(1150) == pytest.approx(0.575, rel=0.02)


def test_too_few_requests_for_a_slope_give_the_ratio_of_sums(tmp_path):
    folder = write_session(tmp_path, [Exchange(claude_code.main_request(turn), {"input_tokens": 400, "cache_read_input_tokens": 100 * turn}, 0.5)
                                      for turn in (1, 2)])
    rate = read_session(folder).prefill_rate()
    assert rate.method == "ratio" and rate.fixed_s is None
    assert rate.tokens_per_s == pytest.approx(800 / 1.0, rel=0.02)


def test_every_prefilled_token_is_charged_to_a_cause_a_cold_start_or_a_kept_prefix(session):
    groups = {group.name: group for group in session.cost_groups()}
    assert set(groups) == {"new conversation", COLD, KEPT}
    assert (groups["new conversation"].requests, groups["new conversation"].prefilled_tokens) == (1, 1150)
    assert groups[COLD].requests == 2 and groups[KEPT].requests == 8
    assert sum(group.prefilled_tokens for group in groups.values()) == session.totals()["prefilled_tokens"]
    assert session.cost_groups()[0].name == "new conversation"  # causes first


# --- the page -------------------------------------------------------------------------------------------


def test_the_page_needs_nothing_from_the_network(session):
    page = render(session)
    assert "<link" not in page and " src=" not in page and "@import" not in page and "url(http" not in page
    assert page.count("http") == page.count('xmlns="http://www.w3.org/2000/svg"')


def test_the_page_draws_one_svg_per_lane_and_links_the_break_marker_to_its_diff(session):
    page = render(session)
    assert page.count('<svg class="lane"') == 2
    assert f'<a class="break" href="#break-{BREAK_SEQ}">' in page and f'id="break-{BREAK_SEQ}"' in page
    assert f'fill="{BREAK}"' in page
    assert "#8 new conversation · messages[1].content[0].text byte" in page
    assert "stable-prefix diff " in page and "0007-main.json" in page and "0008-main.json --normalized" in page


def test_the_dom_does_not_grow_with_the_requests(tmp_path):
    small = render(read_session(scripted_session(tmp_path / "small", main_turns=4, break_at=9, subagent_turns=0)))
    large = render(read_session(scripted_session(tmp_path / "large", main_turns=40, break_at=99, subagent_turns=0)))
    assert large.count("<path") == small.count("<path")


def test_text_from_the_requests_is_escaped(tmp_path):
    hostile = "</script><img src=x onerror=alert(1)>"
    folder = write_session(tmp_path, [Exchange(claude_code.main_request(2, git_status="M a"), {"input_tokens": 9, "cache_read_input_tokens": 0}, 0.1),
                                      Exchange(claude_code.main_request(3, git_status=hostile), {"input_tokens": 9, "cache_read_input_tokens": 0}, 0.1)])
    page = render(read_session(folder))
    assert read_session(folder).breaks
    assert "<img" not in page and "&lt;img src=x onerror=alert(1)" in page
    assert page.count("<script") == 2


def test_a_live_page_reloads_itself(session):
    assert '<meta http-equiv="refresh" content="5">' in render(session, refresh_s=5)
    assert "http-equiv" not in render(session)


# --- reading a folder as it grows -----------------------------------------------------------------------


def test_the_reader_reads_only_the_records_that_appeared_since(tmp_path):
    exchanges = [Exchange(claude_code.main_request(turn), {"input_tokens": 50, "cache_read_input_tokens": 100 * turn}, 0.1) for turn in (1, 2, 3)]
    folder = write_session(tmp_path, exchanges[:2])
    reader = SessionReader(folder)
    assert [bar.seq for bar in reader.read().lanes["main"]] == [1, 2]
    write_session(tmp_path, exchanges[2:])  # the same session folder, continued
    assert [bar.seq for bar in reader.read().lanes["main"]] == [1, 2, 3]
    assert len(reader.read_names) == 3


def test_a_record_that_lands_after_a_later_one_makes_the_reader_start_again_in_order(folder, tmp_path):
    copy = tmp_path / "s"
    shutil.copytree(folder, copy)
    late = copy / "0003-main.json"
    held = late.rename(tmp_path / late.name)
    reader = SessionReader(copy)
    assert [bar.seq for bar in reader.read().lanes["main"]] == [1, 5, 7, 8, 9, 10, 11]
    held.rename(late)
    assert [bar.seq for bar in reader.read().lanes["main"]] == [1, 3, 5, 7, 8, 9, 10, 11]


def test_a_late_record_behind_other_lanes_only_is_placed_without_reading_the_folder_again(folder, tmp_path):
    copy = tmp_path / "s"
    shutil.copytree(folder, copy)
    late = copy / "0006-sub-d0881b.json"  # as if it finished after the main lane's #7 to #11
    held = late.rename(tmp_path / late.name)
    reader = SessionReader(copy)
    first = reader.read()
    assert [bar.seq for bar in first.lanes["sub:d0881b"]] == [2, 4]
    held.rename(late)
    again = reader.read()
    assert again is first  # not read again from the start
    assert [bar.seq for bar in again.lanes["sub:d0881b"]] == [2, 4, 6]
    assert [bar.seq for bar in again.requests] == list(range(1, 12))


def test_files_that_are_not_records_are_named_and_skipped(folder, tmp_path):
    copy = tmp_path / "s"
    shutil.copytree(folder, copy)
    (copy / "0099-main.json").write_text("{not json")
    session = read_session(copy)
    assert len(session.requests) == 11 and session.skipped[0].startswith("0099-main.json: unreadable")
    assert "0099-main.json: unreadable" in render(session)


# --- report --html --------------------------------------------------------------------------------------


def test_report_html_writes_the_page_and_says_where(folder, tmp_path, capsys):
    page = tmp_path / "page.html"
    assert main(["report", str(folder), "--html", str(page)]) == 0
    assert capsys.readouterr().out == f"{page}: 11 requests in 2 lanes, 1 prefix break\n"
    assert page.read_text().startswith("<!doctype html>")


def test_report_html_of_a_folder_without_records_is_an_error(tmp_path, capsys):
    assert main(["report", str(tmp_path), "--html", str(tmp_path / "page.html")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path}: no capture records (NNNN-<lane>.json)\n"
    assert not (tmp_path / "page.html").exists()


# --- the live page, in the proxy ------------------------------------------------------------------------


def page_flow(path=PAGE_PATH, mode="reverse:http://127.0.0.1:1", client="127.0.0.1"):
    flow = tflow.tflow(req=tutils.treq(method=b"GET", path=path.encode(), content=b""))
    flow.client_conn.proxy_mode = ProxyMode.parse(mode)
    flow.client_conn.peername = (client, 50000)
    return flow


def ask(page, flow):
    asyncio.run(page.request(flow))
    return flow.response


@pytest.fixture
def proxy(folder):
    capture, page = Capture(), SessionPage()
    with taddons.context(capture, page) as tctx:
        tctx.configure(capture, capture_dir=str(folder.parent), capture_session=folder.name)
        yield page


def test_the_proxy_answers_its_path_with_the_capture_sessions_page(proxy):
    response = ask(proxy, page_flow())
    assert response.status_code == 200 and response.headers["content-type"] == "text/html; charset=utf-8"
    text = response.get_text()
    assert '<meta http-equiv="refresh" content="5">' in text and f'id="break-{BREAK_SEQ}"' in text


def test_other_paths_and_a_forward_proxys_requests_pass_through(proxy):
    assert ask(proxy, page_flow("/v1/models")) is None
    assert ask(proxy, page_flow(mode="regular")) is None


def test_the_page_is_refused_to_another_machine(proxy):
    response = ask(proxy, page_flow(client="192.168.1.20"))
    assert response.status_code == 403 and "this machine only" in response.get_text()


def test_without_capture_the_page_says_so(tmp_path):
    page = SessionPage()
    with taddons.context(page):
        text = ask(page, page_flow()).get_text()
    assert "No capture session: load addons/capture.py" in text


def test_before_the_first_record_the_page_waits_for_one(tmp_path):
    capture, page = Capture(), SessionPage()
    with taddons.context(capture, page) as tctx:
        tctx.configure(capture, capture_dir=str(tmp_path), capture_session="empty")
        text = ask(page, page_flow()).get_text()
    assert "No request captured yet" in text and 'http-equiv="refresh"' in text


def test_the_script_file_loads_as_mitmdump_loads_it(folder):
    capture = Capture()
    with taddons.context(capture) as tctx:
        tctx.configure(capture, capture_dir=str(folder.parent), capture_session=folder.name)
        (page,) = tctx.script(str(SCRIPT)).addons
        assert ask(page, page_flow()).status_code == 200


def test_a_record_written_while_the_page_is_watched_appears_on_its_next_load(proxy, folder):
    first = ask(proxy, page_flow()).get_text()
    assert first.count('<svg class="lane"') == 2
    record = json.loads((folder / "0011-main.json").read_text())
    (folder / "0012-title.json").write_text(json.dumps({**record, "seq": 12, "lane": "title", "diagnosis": None}))
    try:
        assert ask(proxy, page_flow()).get_text().count('<svg class="lane"') == 3
    finally:
        (folder / "0012-title.json").unlink()


def test_stable_prefix_up_prints_the_live_pages_address(tmp_path, capsys):
    proxy = Server(name="mitmdump", port=18080, process=None, log_path=tmp_path / "proxy.log")
    print_ready(StackOptions(model="m", upstream="http://127.0.0.1:9"), None, proxy, tmp_path / "session", None)
    assert f"  session   http://127.0.0.1:18080{PAGE_PATH}   (this session's page, live" in capsys.readouterr().out
    assert "addons/session_page.py" in PROXY_SCRIPTS
