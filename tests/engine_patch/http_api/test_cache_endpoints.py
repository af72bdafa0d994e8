"""`GET /v1/cache/stats` and `DELETE /v1/cache` walk the disk tier's directory (a clear also waits for the
directory lock a write holds): they run beside the event loop, which streams every other reply (#36)."""

import asyncio
import threading

import pytest

from stable_prefix.engine_patch.http_api.http_endpoints import cache_endpoints

# Long enough for any loaded machine to run a ready coroutine; on failure the test waits this long once.
LOOP_WAIT_S = 30.0


def refuse(detail: str):
    raise ValueError(detail)


class ClearWaitingForTheLoop:
    """A cache whose clear returns only once the event loop ran something else meanwhile (or gives up)."""

    def __init__(self, loop_ran: threading.Event):
        self.loop_ran = loop_ran

    def clear(self, tiers):
        return {"disk_entries_dropped": 0, "loop_ran_meanwhile": self.loop_ran.wait(LOOP_WAIT_S)}


def run_beside_the_loop(handler):
    """Runs `handler()` and, beside it on the same loop, a coroutine that says it ran."""
    loop_ran = threading.Event()

    async def both():
        async def beside():
            loop_ran.set()

        answer, _ = await asyncio.gather(handler(loop_ran), beside())
        return answer

    return asyncio.run(both())


def test_the_stats_walk_leaves_the_event_loop_free():
    def stats_waiting_for_the_loop(loop_ran):
        return lambda: {"loop_ran_meanwhile": loop_ran.wait(LOOP_WAIT_S)}

    answer = run_beside_the_loop(lambda loop_ran: cache_endpoints(None, stats_waiting_for_the_loop(loop_ran), None, refuse)[0]())
    assert answer["loop_ran_meanwhile"]


def test_a_disk_clear_leaves_the_event_loop_free():
    answer = run_beside_the_loop(lambda loop_ran: cache_endpoints(ClearWaitingForTheLoop(loop_ran), dict, None, refuse)[1]("disk"))
    assert answer["status"] == "cleared" and answer["loop_ran_meanwhile"]


def test_an_unknown_tier_is_refused_before_anything_is_cleared():
    cleared = []

    class Recording:
        def clear(self, tiers):
            cleared.append(tiers)
            return {}

    _, clear_cache = cache_endpoints(Recording(), dict, None, refuse)
    with pytest.raises(ValueError, match="tier='gpu'"):
        asyncio.run(clear_cache("gpu"))
    assert cleared == []
