"""``--nsa-report DIR``: the hardware validation report as a by-product of the test run.

``pytest --gpu-profile auto --nsa-report reports/`` writes
``reports/<device>_<commit>_<YYYYMMDD-HHMMSS>/`` with ``report.md`` (for people),
``env.json`` and ``results.json`` (schemas in ``pytest_nsa/schemas/``), the
pytest-benchmark JSON of the run (``benchmarks.json``) and PNG plots when
benchmarks ran (``--nsa-report`` turns on ``--nsa-bench``: the tables are part of
the report). The report is written at session end whatever happened: tests
failing, ``-x``/``--maxfail`` stopping the run, a ``KeyboardInterrupt`` (the
report then says it is partial, and why). Under pytest-xdist only the controller
writes it, from the reports every worker sent it.

Wiring only: the documents are built by :mod:`~pytest_nsa.report_data`,
:mod:`~pytest_nsa.report_bench` and :mod:`~pytest_nsa.report_md`.
"""

from __future__ import annotations

import json
import os
import re
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, List, Optional, Set

import pytest

from pytest_nsa import report_bench, report_data, report_md, xdist
from pytest_nsa.benchmarks import BENCH_KEY, bench_state
from pytest_nsa.report_data import Failure, RunInfo
from pytest_nsa.state import get_state

HELP_REPORT = (
    "Write the validation report (report.md, env.json, results.json, benchmark JSON and plots) "
    "into a new folder DIR/<device>_<commit>_<date>/ at the end of the run, also when tests fail "
    "or the run is interrupted (the report then says it is partial). Implies --nsa-bench "
    "(deselect the benchmarks with -m 'not benchmark')."
)
HELP_COMMIT = (
    "The commit the report names, for a copied tree without git metadata "
    "(default: git rev-parse --short HEAD of the rootdir, 'nogit' when that fails)."
)

#: pytest-benchmark's warning when JSON output is on but nothing was measured.
NO_BENCHMARKS = "Not saving anything, no benchmarks have been run"
BENCHMARK_WARNING = "pytest_benchmark.logger.PytestBenchmarkWarning"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("nsa", "NSA GPU profiles (pytest_nsa)")
    group.addoption("--nsa-report", dest="nsa_report", default=None, metavar="DIR", help=HELP_REPORT)
    group.addoption("--nsa-report-commit", dest="nsa_report_commit", default=None, metavar="REV", help=HELP_COMMIT)


@pytest.hookimpl(tryfirst=True)  # before pytest_nsa.benchmarks reads --nsa-bench
def pytest_configure(config: pytest.Config) -> None:
    target = config.option.nsa_report
    if not target or config.option.help or config.option.version or config.option.collectonly:
        return
    if _report_folder_hid_the_ini(config, target):
        raise pytest.UsageError(
            f"--nsa-report {target}: pytest took this existing folder for a test path when it looked for its "
            f"ini file and rootdir (it reads the command line before any plugin's options are known), and read "
            f"no ini file (rootdir {config.rootpath}); write --nsa-report={target} (with '=')"
        )
    # The report's decode and prefill tables need the (opt-in) benchmark suites: one command, one report.
    config.option.nsa_bench = True
    if hasattr(config, "workerinput"):  # xdist workers get the same options; only the controller writes
        return
    reporter = Reporter(config, Path(config.invocation_params.dir, target))
    config.pluginmanager.register(reporter, "pytest_nsa_report_writer")
    if config.pluginmanager.hasplugin("benchmark"):
        config.pluginmanager.register(_BenchmarkCapture(reporter), "pytest_nsa_report_benchmarks")
        if getattr(config.option, "benchmark_json", None) is None:
            config.option.benchmark_json = _DeferredFile(reporter, report_bench.JSON_FILE)
            # The JSON is ours to ask for: a run without benchmarks needs no warning about it.
            config.addinivalue_line("filterwarnings", f"ignore:{NO_BENCHMARKS}:{BENCHMARK_WARNING}")


#: The files in which pytest looks for its settings (and which make a folder its rootdir).
INI_FILES = ("pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")


def _report_folder_hid_the_ini(config: pytest.Config, target: str) -> bool:
    """Whether ``--nsa-report DIR`` (value apart) named an existing folder and pytest then found no
    ini file although the folder it ran from, or one above it, has one: the project's settings
    (testpaths, markers, addopts) went unread because DIR counted as a test path."""
    args = [str(a) for a in config.invocation_params.args]
    if "--nsa-report" not in args or config.inipath is not None:
        return False
    if not Path(config.invocation_params.dir, target).is_dir():
        return False
    here = Path(config.invocation_params.dir).resolve()
    return any((folder / name).is_file() for folder in (here, *here.parents) for name in INI_FILES)


def first_error_line(longrepr: Any) -> str:
    """The line that says what went wrong: the crash message of a traceback
    (``"AssertionError: assert 1 == 2"``), else the first ``E`` line, else the last line."""
    crash = getattr(longrepr, "reprcrash", None)
    message = getattr(crash, "message", None)
    if message and message.strip():
        return message.strip().splitlines()[0]
    lines = [line.rstrip() for line in str(longrepr).splitlines() if line.strip()]
    marked = [line[1:].strip() for line in lines if line.startswith("E ")]
    return marked[0] if marked else (lines[-1].strip() if lines else "(no error text)")


class Reporter:
    """Collects what the report needs during the run and writes it at session end."""

    def __init__(self, config: pytest.Config, root: Path) -> None:
        self.config = config
        self.root = root
        self.started = datetime.now().astimezone()
        self.failures: List[Failure] = []
        self._seen: Set[tuple] = set()
        self.interrupted: Optional[str] = None
        self.benchmark_json: Optional[Dict[str, Any]] = None
        self.benchmark_json_written = False
        self.written: Optional[Path] = None
        self.partial_reasons: List[str] = []
        self.error: Optional[str] = None
        self._folder: Optional[Path] = None
        # Read at the start: the code under test is the one the run began with.
        given = re.sub(r"[^A-Za-z0-9.-]+", "-", config.option.nsa_report_commit or "").strip("-.")
        # A commit given by hand says nothing about local changes: dirty is unknown.
        self.commit = (given, None) if given else report_data.git_commit(Path(config.rootpath))

    def folder(self) -> Path:
        """The report folder, named and created on first use (the device is known by then)."""
        if self._folder is None:
            hw = get_state(self.config).hardware
            base = f"{report_data.device_slug(hw)}_{self.commit[0]}_{self.started:%Y%m%d-%H%M%S}"
            folder, n = self.root / base, 1
            while folder.exists():  # two runs in the same second
                n += 1
                folder = self.root / f"{base}-{n}"
            folder.mkdir(parents=True)
            self._folder = folder
        return self._folder

    def _add(self, failure: Failure) -> None:
        key = (failure.nodeid, failure.when)
        if key not in self._seen:  # xdist workers each report the same collection error
            self._seen.add(key)
            self.failures.append(failure)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed:
            outcome = "failed" if report.when == "call" else "error"
            self._add(Failure(report.nodeid, outcome, report.when, first_error_line(report.longrepr)))

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self._add(Failure(report.nodeid or "(session)", "error", "collect", first_error_line(report.longrepr)))

    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        text = str(getattr(excinfo.value, "msg", None) or excinfo.value or "").strip()
        self.interrupted = f"interrupted by {excinfo.typename}" + (f": {text}" if text else "")

    def _partial(self, session: pytest.Session, exitstatus: int, ran: int) -> List[str]:
        reasons = [self.interrupted] if self.interrupted else []
        for stop in (session.shouldfail, session.shouldstop):
            if isinstance(stop, str) and stop and f"stopped early: {stop}" not in reasons:
                reasons.append(f"stopped early: {stop}")
        if exitstatus == pytest.ExitCode.INTERNAL_ERROR:
            reasons.append("pytest hit an internal error")
        collected = session.testscollected
        if ran < collected:
            reasons.append(f"{collected - ran} of {collected} collected tests did not run to the end")
        return reasons

    @pytest.hookimpl(trylast=True)  # after pytest_nsa.benchmarks compared with (or saved) the baseline
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        state = get_state(self.config)
        # A test interrupted mid-call counts as not run, not as passed.
        outcomes = state.results.finished()
        # session.exitstatus, not the argument: the benchmark plugin turns a regression into a failure.
        status = int(session.exitstatus)
        run = RunInfo(self.started, datetime.now().astimezone(), status, self.config.invocation_params.args,
                      session.testscollected, xdist.workers(self.config))
        run.unfinished = state.results.unfinished()
        run.worker_notes = dict(state.workers)
        run.partial_reasons = self.partial_reasons = self._partial(session, status, len(outcomes))
        if self.error is not None:  # the folder could not be made for the benchmark JSON already
            return
        try:
            self.written = self._write(state, run, outcomes)
        except OSError as err:  # a full disk or a read-only DIR must not hide the test results
            self.error = f"could not write the report under {self.root}: {err}"

    def _write(self, state: Any, run: RunInfo, outcomes: List[Any]) -> Path:
        folder = self.folder()
        uses_gpu = state.context is not None and state.context.uses_gpu
        device, dtype = ("cuda", "bfloat16") if uses_gpu else ("cpu", "float32")
        routing = {"device": device, "dtype": dtype, "ops": report_data.routing_rows(device, dtype)}
        env = report_data.env_document(state, self.commit, self.started, routing)
        if self.benchmark_json is not None and not self.benchmark_json_written:
            _dump(folder / report_bench.JSON_FILE, self.benchmark_json)
        timed = bench_state(self.config) if BENCH_KEY in self.config.stash else None
        gpu = state.hardware.primary if state.hardware is not None else None
        bench = report_bench.section(self.benchmark_json, timed, outcomes, folder, gpu.name if gpu else "CPU")
        results = report_data.results_document(folder.name, run, outcomes, self.failures, bench,
                                               state.memory_share_gib(run.workers))
        _dump(folder / "env.json", env)
        _dump(folder / "results.json", results)
        (folder / "report.md").write_text(report_md.render(env, results), encoding="utf-8")
        return folder

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        terminalreporter.section("nsa: validation report", sep="-")
        if self.error is not None:
            terminalreporter.line(self.error, red=True)
        elif self.written is not None:
            terminalreporter.line(f"written to {self.written}")
            for reason in self.partial_reasons:
                terminalreporter.line(f"PARTIAL: {reason}", yellow=True)


def _dump(path: Path, document: Any) -> None:
    path.write_text(json.dumps(document, indent=2, sort_keys=False, default=str) + "\n", encoding="utf-8")


class _BenchmarkCapture:
    """Registered only when pytest-benchmark is loaded (its hook names are unknown otherwise)."""

    def __init__(self, reporter: Reporter) -> None:
        self.reporter = reporter

    @pytest.hookimpl(trylast=True)  # see the JSON after every other plugin added to it
    def pytest_benchmark_update_json(self, config: pytest.Config, benchmarks: Any, output_json: Dict[str, Any]) -> None:
        self.reporter.benchmark_json = output_json


class _DeferredFile:
    """Stands in for the value of ``--benchmark-json``, so that pytest-benchmark writes its JSON
    into the report folder; the file is created only when it writes. pytest-benchmark < 5.3
    takes an open file (``with`` this object), 5.3 and later a path it opens (``os.fspath``)."""

    def __init__(self, reporter: Reporter, name: str) -> None:
        self.reporter, self.name = reporter, name
        self._handle: Any = None

    def __enter__(self) -> Any:
        try:
            self._handle = (self.reporter.folder() / self.name).open("wb")
            self.reporter.benchmark_json_written = True
        except OSError as err:  # pytest-benchmark must finish; the report says what went wrong
            self.reporter.error = f"could not write the report under {self.reporter.root}: {err}"
            self._handle = open(os.devnull, "wb")
        return self._handle

    def __exit__(self, *exc: object) -> None:
        self._handle.close()

    def __fspath__(self) -> str:
        try:
            path = self.reporter.folder() / self.name
        except OSError as err:  # as in __enter__: pytest-benchmark must finish
            self.reporter.error = f"could not write the report under {self.reporter.root}: {err}"
            return os.devnull
        self.reporter.benchmark_json_written = True
        return str(path)

    def __str__(self) -> str:
        return str(self.reporter.folder() / self.name)
