"""The session page as a person sees it: a real mitmdump (strip_billing, capture, session_page) before a
loopback stand-in that reports reuse as a prefix cache would, a scripted session whose git status changes at
the main lane's 4th request (a known break), and headless Chromium (Debian's `chromium`, `make chromium`)
showing the live page from the proxy's own port and `report --html`'s file: lanes drawn in the reused and
prefilled colours, the break's marker over that request's bar, unknown reuse hatched, and no script error in
the console."""

import json
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from PIL import Image

from stable_prefix.addons.session_page import PAGE_PATH
from stable_prefix.captures.cli import main as captures_main
from stable_prefix.captures.session_html import BREAK, PREFILLED, REUSED, TTFT, UNKNOWN, LaneGeometry
from stable_prefix.tools import page_browser
from tests.fixtures import claude_code
from tests.support.processes import LOOPBACK, free_port, mitmdump_command, running, serving

pytestmark = [pytest.mark.server, pytest.mark.skipif(page_browser.chromium() is None, reason="needs chromium (make chromium)")]

MAIN_TURNS, BREAK_AT = 6, 4
NO_REUSE = "x-test-no-reuse"  # the stand-in leaves reuse out of that request's usage: the server did not say


@dataclass
class PrefixCacheStandIn:
    """Answers Anthropic streams; a request's prompt is its forwarded body, 4 bytes a token, and what it shares
    from the start with the longest earlier one is reported reused (`cache_read_input_tokens`)."""

    port: int
    prompts: list[bytes] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def usage(self, prompt: bytes, report_reuse: bool) -> dict:
        with self.lock:
            shared = max((_shared_bytes(prompt, earlier) for earlier in self.prompts), default=0)
            self.prompts.append(prompt)
        tokens, reused = len(prompt) // 4, shared // 4
        return {"input_tokens": tokens - reused, "cache_read_input_tokens": reused, "output_tokens": 2} if report_reuse else {"output_tokens": 2}


def _shared_bytes(a: bytes, b: bytes) -> int:
    return next((index for index, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _handler(stand_in: PrefixCacheStandIn):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format, *args):
            pass

        def do_POST(self):
            prompt = self.rfile.read(int(self.headers.get("content-length", 0)))
            usage = stand_in.usage(prompt, report_reuse=NO_REUSE not in self.headers)
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            start = {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "usage": usage}}
            self._event("message_start", start)
            time.sleep(0.02 + usage.get("input_tokens", 0) / 50_000)  # a prefill that grows with what is prefilled
            self._event("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Looked."}})
            self._event("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}})
            self._event("message_stop", {"type": "message_stop"})
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def _event(self, name: str, data: dict) -> None:
            piece = f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.flush()

    return Handler


def send(port: int, body: dict, headers: dict[str, str] | None = None) -> None:
    request = urllib.request.Request(f"http://{LOOPBACK}:{port}/v1/messages", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json", **(headers or {})})
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()


@dataclass(frozen=True)
class Views:
    live: page_browser.PageView  # the proxy's page, screenshot taken
    live_png: Path
    file: page_browser.PageView  # report --html's file, DOM dumped
    break_seq: int


@pytest.fixture(scope="module")
def views(tmp_path_factory) -> Views:
    work = tmp_path_factory.mktemp("session-page")
    stand_in = PrefixCacheStandIn(free_port())
    with serving(_handler(stand_in), stand_in.port, "prefix-cache-stand-in"):
        port = free_port()
        command = mitmdump_command(["addons/strip_billing.py", "addons/capture.py", "addons/session_page.py"], f"http://{LOOPBACK}:{stand_in.port}",
                                   port, {"capture_dir": work / "captures", "capture_session": "live"})
        with running("mitmdump", command, port=port, log_dir=work / "logs", startup_timeout=60):
            for turn in range(1, MAIN_TURNS + 1):
                send(port, claude_code.main_request(turn, git_status="M src/app.py" if turn < BREAK_AT else "M src/app.py\n?? notes.txt"))
                if turn <= 2:
                    send(port, claude_code.subagent_request("explore", turn))
            send(port, claude_code.title_request(), {NO_REUSE: "1"})
            live_png = work / "live.png"
            live = page_browser.screenshot(f"http://{LOOPBACK}:{port}{PAGE_PATH}", live_png, size="1280,1500")
    folder = work / "captures" / "live"
    break_seq = next(int(path.name[:4]) for path in sorted(folder.glob("*-main.json")) if json.loads(path.read_text())["diagnosis"]["prefix_kept"] is False)
    assert captures_main(["report", str(folder), "--html", str(work / "page.html")]) == 0
    return Views(live, live_png, page_browser.dump_dom((work / "page.html").as_uri()), break_seq)


def rgb(colour: str) -> tuple[int, int, int]:
    return tuple(int(colour[i : i + 2], 16) for i in (1, 3, 5))


def pixels_of(image: Image.Image, colour: str) -> list[tuple[int, int]]:
    wanted, width = rgb(colour), image.width
    return [(index % width, index // width) for index, pixel in enumerate(image.get_flattened_data()) if pixel[:3] == wanted]


def test_the_page_runs_without_a_script_error(views):
    assert views.live.console == [] and views.file.console == []


def test_a_script_error_would_be_seen(tmp_path):
    broken = tmp_path / "broken.html"
    broken.write_text("<!doctype html><p id=done>no</p><script>document.getElementById('done').textContent = 'ran'; notDefined();</script>")
    view = page_browser.dump_dom(broken.as_uri())
    assert '<p id="done">ran</p>' in view.output
    assert any("Uncaught ReferenceError: notDefined is not defined" in line for line in view.console)


def test_each_lane_is_drawn_in_the_reused_prefilled_and_ttft_colours(views):
    image = Image.open(views.live_png).convert("RGB")
    for colour in (REUSED, PREFILLED, TTFT):
        assert len(pixels_of(image, colour)) > 200, colour
    assert views.file.output.count('<svg class="lane"') == 3  # main, the subagent, the title request


def test_reuse_the_server_did_not_report_is_drawn_hatched(views):
    image = Image.open(views.live_png).convert("RGB")
    assert len(pixels_of(image, UNKNOWN)) > 20
    assert 'fill="url(#unknown)"' in views.file.output


def test_the_break_marker_stands_over_the_scripted_breaks_bar(views):
    assert views.break_seq == 6  # the main lane's 4th request: the subagent's two came between its first three
    assert f'<a class="break" href="#break-{views.break_seq}">' in views.file.output and f'id="break-{views.break_seq}"' in views.file.output
    image = Image.open(views.live_png).convert("RGB")
    red = pixels_of(image, BREAK)
    columns = {}
    for x, y in red:
        columns.setdefault(x, []).append(y)
    line_x = max(columns, key=lambda x: len(columns[x]))  # the dashed line down the bar: the column with the most red
    top, bottom = min(columns[line_x]), max(columns[line_x])
    bars = [x for colour in (REUSED, PREFILLED) for x, y in pixels_of(image, colour) if top <= y <= bottom]
    step = LaneGeometry(MAIN_TURNS, label_rows=1).step
    assert (line_x - min(bars)) // step == BREAK_AT - 1  # the main lane's 4th bar
