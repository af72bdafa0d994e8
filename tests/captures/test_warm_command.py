"""`stable-prefix warm FILE... --url URL`: each request is replayed with one token to generate, so a server prefills and keeps
its prompt; it needs nothing of the engine (any server answering the API can be warmed)."""

import json

from stable_prefix import cli
from tests.support.processes import free_port, serving
from tests.support.recording_anthropic_stub import RecordingHandler

BODY = {"model": "claude-sonnet", "max_tokens": 4096, "stream": True, "system": "You are a coding agent.",
        "messages": [{"role": "user", "content": "Which files changed in the last commit?"}]}


def test_warm_sends_each_request_for_one_unstreamed_token_and_reports_what_the_server_reused(tmp_path, capsys):
    (tmp_path / "turn.json").write_text(json.dumps(BODY))
    record = tmp_path / "arrived.jsonl"
    recorder = type("Recorder", (RecordingHandler,), {"record_path": record})
    port = free_port()
    with serving(recorder, port, "recording"):
        status = cli.main(["warm", str(tmp_path / "turn.json"), "--url", f"http://127.0.0.1:{port}", "--model", "tiny"])
    (arrived,) = [json.loads(line) for line in record.read_text().splitlines()]
    assert status == 0
    assert arrived["path"] == "/v1/messages"
    assert arrived["body"] == {**BODY, "model": "tiny", "max_tokens": 1, "stream": False}
    assert f"warmed {tmp_path / 'turn.json'}: " in capsys.readouterr().out


def test_warm_names_a_file_it_cannot_read_and_warms_nothing(tmp_path, capsys):
    (tmp_path / "broken.json").write_text("{not json")
    assert cli.main(["warm", str(tmp_path / "broken.json"), "--url", "http://127.0.0.1:9"]) == 1
    assert "broken.json: not valid JSON" in capsys.readouterr().err
