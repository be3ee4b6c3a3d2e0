"""A pytest plugin for the GPU session scripts: each failure's report is appended to
``$OUT/failures.txt`` as soon as it arrives (on the xdist controller too), so that a run cut short by
the device tool's time limit still says why its failures failed. ``-p pytest_failures_now``."""

from __future__ import annotations

import os


def pytest_runtest_logreport(report):
    if report.failed:
        path = os.path.join(os.environ.get("OUT", "."), "failures.txt")
        with open(path, "a") as out:
            out.write(f"== {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")
