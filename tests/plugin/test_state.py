"""SessionResults: a test counts once its protocol ends; an interrupted test does not."""

from __future__ import annotations

import pytest

from pytest_nsa.state import SessionResults


def _report(when: str, outcome: str = "passed") -> pytest.TestReport:
    return pytest.TestReport("test_x.py::test_a", ("test_x.py", 0, "test_a"), {"parity": 1}, outcome, None, when)


def test_interrupted_test_is_unfinished_not_passed():
    results = SessionResults()
    results.record(_report("setup"))
    results.record(_report("call"))
    assert results.unfinished() == ["test_x.py::test_a"]
    assert results.finished() == [] and results.counts() == {}


def test_teardown_finishes_and_a_teardown_error_follows_a_pass():
    results = SessionResults()
    for when in ("setup", "call"):
        results.record(_report(when))
    results.record(_report("teardown", "failed"))
    (outcome,) = results.finished()
    assert outcome.finished and outcome.outcome == "error" and outcome.markers == ("parity",)
    assert results.unfinished() == [] and results.counts() == {"error": 1}
