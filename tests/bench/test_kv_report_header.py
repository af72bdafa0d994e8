"""The bytes bench's header says how loaded the machine was (its timings are noisy on a shared box); a result
from before the load was recorded reads as it did."""

from stable_prefix.bench.measure import kv_report


def result(**extra) -> dict:
    return {"mode": "in process", "command": "python -m stable_prefix.bench.kv_bytes", "generated_at": "2026-12-04 05:09 UTC",
            "duration_s": 360.0, "machine": "2 CPU cores, AMD EPYC, Linux", "budgets": {"ram_bytes": 16 * 2**30, "disk_bytes": 20 * 2**30},
            "engines": [{"label": "main at abc1234, engine 0123abcd", "tree": "/work/main"}], "sessions": {}, "shapes": {}, "runs": [], **extra}


def test_the_header_gives_the_load_average_at_the_start_and_the_end():
    header = kv_report.markdown(result(load_average={"start": 3.14, "end": 5.0})).splitlines()[0]
    assert header.endswith("2 CPU cores, AMD EPYC, Linux, load average 3.1 at the start and 5.0 at the end).")


def test_a_result_without_the_load_reads_as_before():
    assert kv_report.markdown(result()).splitlines()[0].endswith("2 CPU cores, AMD EPYC, Linux).")
