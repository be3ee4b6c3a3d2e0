"""The plugin's per-run state in ``config.stash``, and the session's test results.

Other parts of the plugin (benchmarks, report) read :func:`get_state`:
``state.selection.profile`` is the active profile, ``state.hardware`` and
``state.software`` what was detected, ``state.results`` the outcome of every test
(on the xdist controller too, since worker reports reach it through
``pytest_runtest_logreport``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import pytest

from pytest_nsa import gpu_memory, margins
from pytest_nsa.env import AppliedEnv
from pytest_nsa.hardware import HardwareInfo
from pytest_nsa.markers import MARKERS, Context
from pytest_nsa.profiles import Catalog
from pytest_nsa.selection import Selection
from pytest_nsa.versions import SoftwareInfo, Verdict
from pytest_nsa.sharing import DeviceTurns
from pytest_nsa.xdist import Pin


@dataclass(frozen=True)
class TestOutcome:
    """The final outcome of one test.

    Attributes:
        outcome: ``passed``, ``failed``, ``error`` (setup/teardown failed),
            ``skipped``, ``xfailed`` or ``xpassed``.
        markers: the pytest_nsa markers on the test (see :data:`pytest_nsa.markers.MARKERS`).
        skip_reason: the reason of a skip, without pytest's ``"Skipped: "`` prefix.
        duration: seconds over setup, call and teardown.
        worker: the xdist worker that ran it, ``None`` without xdist.
        finished: its teardown was reported. A test interrupted mid-call has only
            its setup report: it did not run to the end, whatever ``outcome`` says.
        comparisons: every ``nsa.testing.assert_close`` of its call, as
            ``(name, relative error, bound, dtype)`` (:mod:`pytest_nsa.margins`).
        gpu_memory: ``(peak, allocated at the start, allocated after the teardown, ran alone,
            local memory)`` where it used torch's CUDA (:data:`pytest_nsa.gpu_memory.Measured`), else ``None``.
    """

    __test__ = False  # not a test class, whatever pytest's collection thinks of the name

    nodeid: str
    outcome: str
    markers: Tuple[str, ...] = ()
    skip_reason: Optional[str] = None
    duration: float = 0.0
    worker: Optional[str] = None
    finished: bool = False
    comparisons: Tuple[Tuple[str, float, float, str], ...] = ()
    gpu_memory: Optional[gpu_memory.Measured] = None


def _skip_reason(longrepr: Any) -> str:
    if isinstance(longrepr, (tuple, list)) and len(longrepr) == 3:
        text = str(longrepr[2])
    else:
        text = str(longrepr)
    return text[len("Skipped: "):] if text.startswith("Skipped: ") else text


def _worker_of(report: pytest.TestReport) -> Optional[str]:
    # xdist's controller attaches the WorkerController that sent the report as ``node``.
    gateway = getattr(getattr(report, "node", None), "gateway", None)
    return getattr(gateway, "id", None)


@dataclass
class SessionResults:
    """Outcomes by node id, filled from test reports in the order pytest delivers them."""

    outcomes: Dict[str, TestOutcome] = field(default_factory=dict)

    def record(self, report: pytest.TestReport) -> None:
        """Fold one setup/call/teardown report into the test's outcome (the first
        non-pass wins, except that a teardown error follows a pass)."""
        prev = self.outcomes.get(report.nodeid)
        duration = (prev.duration if prev else 0.0) + getattr(report, "duration", 0.0)
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
        elif report.skipped:
            outcome = "skipped"
        elif report.failed:
            outcome = "failed" if report.when == "call" else "error"
        else:
            outcome = "passed"
        if prev is not None and (prev.outcome != "passed" or outcome == "passed"):
            outcome = prev.outcome
        reason = _skip_reason(report.longrepr) if outcome == "skipped" and report.skipped else None
        properties = getattr(report, "user_properties", ())
        self.outcomes[report.nodeid] = TestOutcome(
            nodeid=report.nodeid,
            outcome=outcome,
            markers=tuple(sorted(k for k in report.keywords if k in MARKERS)),
            skip_reason=reason if reason is not None else (prev.skip_reason if prev else None),
            duration=duration,
            worker=_worker_of(report),
            finished=(prev is not None and prev.finished) or report.when == "teardown",
            # Every phase's report copies the item's user_properties: the first that has them wins.
            comparisons=prev.comparisons if prev is not None and prev.comparisons
            else margins.from_properties(properties),
            gpu_memory=prev.gpu_memory if prev is not None and prev.gpu_memory is not None
            else gpu_memory.from_properties(properties),
        )

    def finished(self) -> List[TestOutcome]:
        """Outcomes of the tests that ran to the end (an interrupted test is not one)."""
        return [o for o in self.outcomes.values() if o.finished]

    def unfinished(self) -> List[str]:
        """Node ids of tests that started but did not run to the end."""
        return [o.nodeid for o in self.outcomes.values() if not o.finished]

    def counts(self) -> Dict[str, int]:
        """``{outcome: n}`` over the tests that ran to the end."""
        return dict(Counter(o.outcome for o in self.finished()))

    def skips_by_reason(self) -> List[Tuple[str, int]]:
        """``(reason, count)`` pairs, most frequent first, then by reason."""
        counter = Counter(o.skip_reason or "(no reason given)" for o in self.outcomes.values() if o.outcome == "skipped")
        return sorted(counter.items(), key=lambda item: (-item[1], item[0]))


@dataclass
class NSAState:
    """Everything the plugin decided for this run.

    Attributes:
        request: ``--gpu-profile`` as given (``None`` when absent).
        on_mismatch: ``--gpu-profile-mismatch`` (``error`` or ``skip``).
        catalog: where profiles are looked up by name.
        engaged: whether the run asks for the plugin (:func:`pytest_nsa.lifecycle.engaged`); a run
            that does not is left alone, and nothing below is set.
        real_hardware: the real detection, cached (it initialises CUDA once).
        context: what requirement markers are judged against (set in ``pytest_configure``).
        warnings: problems worth a line in the report header (unknown ``NSA_``
            variables, kernels imported too early, ...).
        turns: on an xdist worker that shares its GPU, the device turns it takes
            (:mod:`~pytest_nsa.sharing`).
        workers: ``{worker id: note}`` reported back by xdist workers.
    """

    request: Optional[str]
    on_mismatch: str
    catalog: Catalog
    engaged: bool = True
    hardware: Optional[HardwareInfo] = None
    real_hardware: Optional[HardwareInfo] = None
    software: Optional[SoftwareInfo] = None
    selection: Optional[Selection] = None
    verdicts: Tuple[Verdict, ...] = ()
    env: Optional[AppliedEnv] = None
    pin: Optional[Pin] = None
    cpu_threads: Optional[int] = None  # an xdist worker's torch threads (xdist.cpu_threads)
    turns: Optional[DeviceTurns] = None
    warnings: List[str] = field(default_factory=list)
    context: Optional[Context] = None
    workers: Dict[str, str] = field(default_factory=dict)
    results: SessionResults = field(default_factory=SessionResults)

    def memory_share_gib(self, workers: int) -> Optional[float]:
        """Each xdist worker's share of its GPU's memory where ``workers`` share the GPUs, else ``None``."""
        hw = self.hardware
        if hw is None or hw.primary is None:
            return None
        return gpu_memory.share_of_device(hw.primary.memory_gib, hw.gpu_count, workers)


STATE_KEY = pytest.StashKey[NSAState]()


def get_state(config: pytest.Config) -> NSAState:
    """The run's :class:`NSAState` (created when the plugin starts)."""
    return config.stash[STATE_KEY]
