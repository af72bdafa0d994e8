"""The suite's time as a budget: at the end of a run, the wall time against the budget and the slowest test files.

`make test` must stay within SUITE_BUDGET_MINUTES of pytest on the project's 2-core machine from a clean clone (CI
allows 90 and runs setup too), the fast loop within FAST_LOOP_BUDGET_MINUTES. A run over its budget does not fail:
a timed test depends on the machine's load (docs/testing.md), so the summary names the files that spent the time,
which is where a new slow test shows first. Files, not tests, because `make test` runs each file whole in one worker
(`--dist loadfile`): a file's total is what it costs the run.
"""

import time
from collections import defaultdict

import pytest

SUITE_BUDGET_MINUTES = 40
FAST_LOOP_BUDGET_MINUTES = 5
SLOWEST_FILES_SHOWN = 12


class SuiteBudget:
    def __init__(self) -> None:
        self.started = time.monotonic()
        self.seconds_by_file: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # Setup, call and teardown each report; a module's servers start in the first test's setup.
        self.seconds_by_file[report.nodeid.split("::", 1)[0]] += report.duration

    def pytest_terminal_summary(self, terminalreporter, config: pytest.Config) -> None:
        if not self.seconds_by_file:
            return
        minutes = (time.monotonic() - self.started) / 60
        fast_loop = "not slow" in (config.getoption("markexpr", "") or "")
        budget = FAST_LOOP_BUDGET_MINUTES if fast_loop else SUITE_BUDGET_MINUTES
        name = "the fast loop's" if fast_loop else "the suite's"
        verdict = "within" if minutes <= budget else "OVER"
        terminalreporter.section("time budget")
        terminalreporter.write_line(f"{minutes:.1f} min of {name} {budget}-minute budget: {verdict}")
        terminalreporter.write_line("slowest files (seconds, setup + tests + teardown, summed across workers):")
        slowest = sorted(self.seconds_by_file.items(), key=lambda item: item[1], reverse=True)
        for path, seconds in slowest[:SLOWEST_FILES_SHOWN]:
            terminalreporter.write_line(f"  {seconds:7.1f}  {path}")


def pytest_configure(config: pytest.Config) -> None:
    # Only the process that reports: under xdist the workers' reports reach the controller.
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(SuiteBudget(), "suite_budget")
