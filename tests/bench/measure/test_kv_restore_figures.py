"""The bytes bench's restore figures: GB/s per source from the restart's restores, memcpy beside them, and
issue 37's targets judged against the lower of the fixed rate and half the memcpy of the same run."""

from stable_prefix.bench.measure import kv_report
from stable_prefix.bench.measure.kv_figures import restore_rates


def restart(disk_evicted: bool = True) -> dict:
    return {"restores": {"disk": {"seconds": 2.0, "bytes": 2e9, "evicted_from_page_cache": disk_evicted},
                         "page_cache": {"seconds": 1.0, "bytes": 2e9}, "ram": {"seconds": 0.5, "bytes": 2e9}},
            "memcpy": {"bytes": 1e9, "warm_s": 0.25, "fresh_s": 0.5}}


def test_each_source_is_the_state_restored_over_its_time_and_memcpy_is_measured_beside():
    rates = restore_rates(restart())
    assert rates == {"restore_gb_per_s_from_disk": 1.0, "restore_gb_per_s_from_page_cache": 2.0,
                     "restore_gb_per_s_from_ram_after_restart": 4.0, "memcpy_gb_per_s": 4.0, "memcpy_gb_per_s_new_memory": 2.0}


def test_a_disk_figure_whose_files_could_not_leave_the_page_cache_is_unknown():
    assert restore_rates(restart(disk_evicted=False))["restore_gb_per_s_from_disk"] is None


def test_a_run_without_restores_reports_them_unknown():
    assert set(restore_rates({}).values()) == {None}


def test_the_targets_are_the_lower_of_the_fixed_rate_and_half_the_memcpy():
    figures = {**restore_rates(restart()), "restore_gb_per_s_ram": 3.0}
    table = kv_report.restores_table({"runs": [{"session": "demo", "shape": "30b-a3b", "engine": "e", "figures": figures}]})
    assert table[-1].endswith("| met (>= 2.00), met (>= 2.00) |")
