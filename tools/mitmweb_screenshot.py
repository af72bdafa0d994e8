"""A screenshot of mitmweb showing a broken-prefix flow, for the docs (needs Debian's `chromium`).

    python -m stable_prefix.tools.mitmweb_screenshot --out docs/mitmweb-broken-prefix.png

Runs `stable-prefix up MODEL --web` (the test tiny model by default), sends
three requests of one lane shaped like Claude Code's (the third after the git
status in the system prompt changed, as after `/clear`: its prefix breaks),
opens that flow's comment in mitmweb, and lets headless Chromium take the
picture. Everything runs on 127.0.0.1 and is stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from stable_prefix.servers import LOOPBACK, REPO_ROOT, VENV_BIN, free_port

DEFAULT_MODEL = REPO_ROOT / "build" / "tiny-model-test"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]
# Longer than a lane's opening (256 characters), so the git status after it is not part of the lane's identity.
INSTRUCTIONS = "".join(f"{rule}\n" for rule in (
    "You are a careful coding agent that works in the user's terminal.", "Work in small steps and explain each change briefly.",
    "Prefer editing existing files to creating new ones.", "Run the tests after every change and report failures verbatim.",
    "Keep answers short unless the user asks for detail."))
TOOLS = [{"name": name, "description": f"{name} a file or run a command.",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}} for name in ("Read", "Edit", "Bash", "Task")]


def request_body(turns: int, git_status: str, billing: str) -> dict:
    """A main-agent request of our own making: billing block, instructions ending in the git status, tools, turns."""
    messages = []
    for turn in range(1, turns + 1):  # each turn appends an answer and the next question
        if turn > 1:
            messages.append({"role": "assistant", "content": f"src/part{turn - 1}.py defines part{turn - 1}()."})
        messages.append({"role": "user", "content": f"Step {turn}: look at src/part{turn}.py."})
    return {"model": "claude-opus-4-8", "max_tokens": 32000, "stream": True, "tools": TOOLS, "messages": messages,
            "system": [{"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.0.{billing}; cc_entrypoint=cli;"},
                       {"type": "text", "text": INSTRUCTIONS + "\ngitStatus: " + git_status}]}


def post(url: str, body: dict) -> None:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        response.read()


def wait_for_state(state_path: Path, launcher: subprocess.Popen, timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    while not state_path.exists():
        if launcher.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"stable-prefix up did not come up (exit status {launcher.poll()})")
        time.sleep(0.5)
    return json.loads(state_path.read_text())


def broken_flow_id(web_root: str, token: str) -> str:
    request = urllib.request.Request(f"{web_root}/flows", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        flows = json.load(response)
    marked = [flow for flow in flows if flow["marked"] and "prefix broke" in flow["comment"]]
    if not marked:
        raise RuntimeError(f"no marked broken-prefix flow in mitmweb: {[flow['comment'] for flow in flows]}")
    return marked[-1]["id"]


def screenshot(url: str, out: Path, chromium: str, size: str) -> None:
    with tempfile.TemporaryDirectory() as profile:
        command = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={size}",
                   "--virtual-time-budget=8000", f"--screenshot={out.resolve()}", url]
        subprocess.run(command, check=True, capture_output=True, timeout=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "mitmweb-broken-prefix.png")
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--size", default="1400,640", help="window size WIDTH,HEIGHT")
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("error: chromium not found (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory() as work:
        port, web_port = free_port(), free_port()
        state_path = Path(work) / "state" / "stable-prefix" / f"stack-{port}.json"
        launcher = subprocess.Popen(
            [str(VENV_BIN / "stable-prefix"), "up", str(args.model), "--port", str(port), "--web", "--web-port", str(web_port),
             "--max-tokens", "8", "--capture-dir", str(Path(work) / "captures")],
            env={**os.environ, "XDG_STATE_HOME": str(Path(work) / "state")}, stdout=subprocess.DEVNULL, cwd=work)
        try:
            state = wait_for_state(state_path, launcher)
            proxy = f"http://{LOOPBACK}:{port}/v1/messages"
            post(proxy, request_body(1, "M src/app.py", "a3f"))
            post(proxy, request_body(2, "M src/app.py", "b71"))
            post(proxy, request_body(1, "M src/app.py\n?? notes.md", "c09"))  # a new conversation: the prefix breaks
            web_root, token = state["web_url"].split("/?token=")
            flow_id = broken_flow_id(web_root, token)
            screenshot(f"{web_root}/?token={token}#/flows/{flow_id}/comment", args.out, chromium, args.size)
        finally:
            launcher.send_signal(signal.SIGINT)
            launcher.wait(timeout=60)
    print(args.out)


if __name__ == "__main__":
    main()
