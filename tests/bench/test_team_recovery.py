"""The team bench's count of what a user loses when a replica dies: recovered by the agent, by the proxy, or lost."""

from stable_prefix.addons.stream_recovery import recovered_in_log, recovered_line
from stable_prefix.bench.team import mark_completed_by_proxy, recovery_figures


def row(user: str, answer: str, *, cut: str | None = None, recovered_by: str | None = None, lost: bool = False, recovery_s: float | None = None) -> dict:
    return {"user": user, "response_id": answer, "cut": cut, "recovered_by": recovered_by, "lost": lost, "loss": "error event" if lost else None,
            "recovery_s": recovery_s}


def test_the_proxys_log_line_names_the_answer_and_the_time_to_the_whole_answer():
    line = recovered_line("replay", "chatcmpl-7", "1 request(s) to http://127.0.0.1:8090 (replay); the client had 20 output events", 2.456)
    log = f"[12:00:01.000] POST /v1/chat/completions: {line} (3 completed since the proxy started)\n[12:00:02.000] other line\n"
    assert recovered_in_log(log) == {"chatcmpl-7": 2.46}


def test_a_stream_the_proxy_completed_counts_as_recovered_by_the_proxy_for_that_user_only():
    rows = [row("u1", "chatcmpl-7"), row("u2", "chatcmpl-7"), row("u1", "chatcmpl-8")]
    mark_completed_by_proxy(rows, {"u1": recovered_line("replay", "chatcmpl-7", "...", 1.5), "u2": ""})
    assert [(r["recovered_by"], r["recovery_s"]) for r in rows] == [("proxy", 1.5), (None, None), (None, None)]


def test_what_each_cut_became_is_counted_once():
    rows = [row("u1", "a", cut="error event", recovered_by="agent", recovery_s=3.0), row("u1", "b", cut="unseen", recovered_by="proxy", recovery_s=1.0),
            row("u2", "c", lost=True), row("u2", "d")]
    figures = recovery_figures(rows)
    assert (figures["cut"], figures["recovered_by_agent"], figures["recovered_by_proxy"], figures["lost"]) == (3, 1, 1, 1)
    assert (figures["recovery_s_median"], figures["recovery_s_max"]) == (2.0, 3.0)
