"""The security suite: each test names the finding of issue 18 it reproduces with
`@pytest.mark.finding(ROW, before="what an attacker got", after="what they get now")`, and
the run ends with a table of every finding, what it was, what it is now, and whether the
tests that reproduce it passed. A finding whose tests failed shows FAIL: the table cannot
claim a fix the tests did not show."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import pytest


@dataclass
class _Finding:
    before: str = ""
    after: str = ""
    outcomes: list[str] = field(default_factory=list)


_FINDINGS: dict[int, _Finding] = defaultdict(_Finding)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "finding(row, before, after): the issue 18 finding a security test reproduces"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    marker = item.get_closest_marker("finding")
    if marker is None or (report.when != "call" and report.passed):
        return
    row = int(marker.args[0])
    finding = _FINDINGS[row]
    finding.before = finding.before or marker.kwargs.get("before", "")
    finding.after = finding.after or marker.kwargs.get("after", "")
    if report.when == "call" or report.failed or report.skipped:
        finding.outcomes.append(report.outcome)


def pytest_terminal_summary(terminalreporter) -> None:  # type: ignore[no-untyped-def]
    if not _FINDINGS:
        return
    write = terminalreporter.write_line
    terminalreporter.section("issue 18 findings: row -> before -> after")
    for row in sorted(_FINDINGS):
        finding = _FINDINGS[row]
        counts = {o: finding.outcomes.count(o) for o in ("passed", "failed", "skipped")}
        verdict = "FAIL" if counts["failed"] else ("ok" if counts["passed"] else "skipped")
        tally = ", ".join(f"{n} {o}" for o, n in counts.items() if n)
        write(f"{row:>2} | {verdict:<7} | {tally}")
        write(f"   | before: {finding.before}")
        write(f"   | after:  {finding.after}")
