"""Benchmarks: opt-in timing runs, per-profile baselines, and the comparison at session end.

Options::

    --nsa-bench                       run the tests that use the ``nsa_bench`` fixture
    --nsa-baseline=save|compare|off   write the baseline / compare with it (default) / neither
    --nsa-baseline-dir=PATH           where baselines live (default <rootdir>/gpu_profiles/baselines)

Benchmarks are opt-in: timing the GPU suite takes minutes and CPU timings on a
shared runner are noise, so tests that take the :func:`nsa_bench` fixture skip
unless ``--nsa-bench`` (or ``--nsa-baseline=save``, or ``--benchmark-only``) is
given. They time through pytest-benchmark; this module reads the statistics
through its public hooks (``pytest_benchmark_group_stats``, called once at
session end with every benchmark's flat stats and ``extra_info``) and adds the
machine to its ``machine_info``.

At session end the benchmarks that passed are saved to, or compared with,
``<dir>/<profile>/benchmarks.json`` (:mod:`nsa.bench.baselines`). A regression
beyond the profile's ``regression_threshold_pct`` (``host_bound_threshold_pct``
for a host-bound benchmark) that also exceeds the measured spread fails the
session with a table; improvements never fail; a missing
baseline is reported; a baseline from another device or software stack is
refused naming the fields that differ. Under pytest-xdist pytest-benchmark
disables its timing, so nothing is recorded or compared, the tests run once as
smoke tests and the summary says so (``save`` is refused up front).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional

import pytest

from nsa.bench import baselines
from pytest_nsa import lifecycle
from pytest_nsa.profiles import BenchmarkSettings
from pytest_nsa.state import get_state

HELP_BENCH = "Run the NSA benchmark suites (tests using the nsa_bench fixture); they skip otherwise."
HELP_BASELINE = (
    "Benchmark baselines of the active GPU profile: 'compare' (default) judges this run against "
    "the stored one, failing on a regression beyond the profile's threshold and the measured "
    "spread; 'save' writes or updates it (and runs the benchmarks); 'off' does neither."
)
HELP_DIR = "Folder of the per-profile baselines (default: <rootdir>/gpu_profiles/baselines)."
MODES = ("save", "compare", "off")
#: Warm-up calls and time budget (seconds) per benchmark, by device type.
WARMUP = {"cuda": 10, "cpu": 1}
BUDGET_S = {"cuda": 30.0, "cpu": 2.0}
SERIAL_HINT = "time them serially: python -m pytest tests/benchmarks --nsa-bench -p no:xdist"


@dataclass
class BenchState:
    """This run's benchmark decisions and outcome (``config.stash``).

    Attributes:
        mode: ``--nsa-baseline``.
        enabled: whether benchmark tests run (``--nsa-bench`` and friends).
        folder: the baselines folder.
        xdist: pytest-xdist distributes this run (timing is then disabled).
        captured: pytest-benchmark's flat stats of this run's benchmarks (dicts with
            ``fullname``, ``median``, ``iqr``, ... and ``extra_info``).
        measured: name -> :class:`~nsa.bench.baselines.Entry` of the timed benchmarks that passed.
        path: the baseline file of the active profile (set at session end).
        rows: the comparison, when one was made.
        lines: what the terminal summary prints.
        failed: a regression fails the session.
    """

    mode: str
    enabled: bool
    folder: Path
    xdist: bool
    captured: List[Mapping[str, Any]] = field(default_factory=list)
    measured: Dict[str, baselines.Entry] = field(default_factory=dict)
    path: Optional[Path] = None
    rows: List[baselines.Row] = field(default_factory=list)
    lines: List[str] = field(default_factory=list)
    failed: bool = False


BENCH_KEY = pytest.StashKey[BenchState]()


def bench_state(config: pytest.Config) -> BenchState:
    """The run's :class:`BenchState` (for the report and the tests)."""
    return config.stash[BENCH_KEY]


@dataclass(frozen=True)
class BenchContext:
    """What a benchmark test needs: the ``nsa_bench`` fixture's value.

    Attributes:
        profile: the active profile's name.
        settings: its ``benchmark`` section (contexts, batch sizes, rounds, ...).
        device: ``torch.device`` the benchmarks run on.
        machine: :func:`nsa.bench.baselines.machine_fields` of this run (goes into ``extra_info``).
        warmup: untimed calls before the rounds.
        budget_s: seconds one benchmark may spend (fewer rounds for slow paths, at least 3).
    """

    profile: str
    settings: BenchmarkSettings
    device: Any
    machine: Mapping[str, Any]
    warmup: int
    budget_s: float


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("nsa", "NSA GPU profiles (pytest_nsa)")
    group.addoption("--nsa-bench", dest="nsa_bench", action="store_true", help=HELP_BENCH)
    # default None, read as "compare": given at all, it engages the plugin (lifecycle.engaged)
    group.addoption("--nsa-baseline", dest="nsa_baseline", default=None, choices=MODES, help=HELP_BASELINE)
    group.addoption("--nsa-baseline-dir", dest="nsa_baseline_dir", default=None, metavar="PATH", help=HELP_DIR)


def _xdist(config: pytest.Config) -> bool:
    # The controller has -n/--dist; a worker has the environment variable (and workerinput).
    return config.getoption("dist", "no") != "no" or "PYTEST_XDIST_WORKER" in os.environ


def pytest_configure(config: pytest.Config) -> None:
    # not engaged: another project's pytest-benchmark runs get no baseline of ours, nor our machine fields
    if config.option.help or config.option.version or not lifecycle.start(config).engaged:
        return
    mode = config.option.nsa_baseline or "compare"
    folder = Path(config.option.nsa_baseline_dir or Path(config.rootpath) / "gpu_profiles" / "baselines")
    enabled = config.option.nsa_bench or mode == "save" or bool(getattr(config.option, "benchmark_only", False))
    state = BenchState(mode, enabled, folder, _xdist(config))
    config.stash[BENCH_KEY] = state
    has_benchmark = config.pluginmanager.hasplugin("benchmark")
    if mode == "save" and not has_benchmark:
        raise pytest.UsageError("--nsa-baseline=save needs pytest-benchmark (pip install pytest-benchmark)")
    if mode == "save" and state.xdist:
        raise pytest.UsageError(f"--nsa-baseline=save: pytest-xdist disables benchmark timing; {SERIAL_HINT} "
                                "--nsa-baseline=save (or -n 0)")
    if has_benchmark:
        config.pluginmanager.register(_BenchmarkHooks(state), "pytest_nsa_benchmark_hooks")


def _profile_name(config: pytest.Config) -> str:
    return get_state(config).context.profile.name


def _machine(config: pytest.Config) -> Dict[str, Any]:
    state = get_state(config)
    return baselines.machine_fields(_profile_name(config), state.hardware, state.software)


def benchmark_settings(config: pytest.Config) -> BenchmarkSettings:
    """The active profile's ``benchmark`` section (for ``pytest_generate_tests``)."""
    return get_state(config).context.profile.benchmark


def uses_gpu(config: pytest.Config) -> bool:
    """Whether this run's benchmarks run on the GPU (collection-time twin of ``nsa_device``)."""
    import torch

    return get_state(config).context.uses_gpu and torch.cuda.is_available()


@pytest.fixture(scope="session")
def nsa_bench(pytestconfig: pytest.Config) -> BenchContext:
    """The benchmark context (see :class:`BenchContext`); skips unless benchmarks are enabled."""
    if BENCH_KEY not in pytestconfig.stash or not bench_state(pytestconfig).enabled:
        pytest.skip("benchmarks run only with --nsa-bench (or --nsa-baseline=save)")
    import torch

    device = torch.device("cuda" if uses_gpu(pytestconfig) else "cpu")
    return BenchContext(_profile_name(pytestconfig), benchmark_settings(pytestconfig), device,
                        _machine(pytestconfig), WARMUP[device.type], BUDGET_S[device.type])  # fmt: skip


class _BenchmarkHooks:
    """Registered only when pytest-benchmark is loaded (its hook names are unknown otherwise)."""

    def __init__(self, state: BenchState) -> None:
        self.state = state

    def pytest_benchmark_update_machine_info(self, config: pytest.Config, machine_info: Dict[str, Any]) -> None:
        machine_info["nsa"] = _machine(config)

    @pytest.hookimpl(wrapper=True)
    def pytest_benchmark_group_stats(self, config: pytest.Config, benchmarks: List[Mapping[str, Any]],
                                     group_by: str) -> Iterator[None]:  # fmt: skip
        # Flat stats of this run ("path" is set only on rows loaded by --benchmark-compare).
        self.state.captured = [b for b in benchmarks if not b.get("path")]
        return (yield)


def _passed(config: pytest.Config) -> Dict[str, bool]:
    return {nodeid: o.finished and o.outcome == "passed" for nodeid, o in get_state(config).results.outcomes.items()}


def _benchmark_tests(config: pytest.Config) -> int:
    return sum(1 for o in get_state(config).results.outcomes.values() if "benchmark" in o.markers)


def _save(state: BenchState, config: pytest.Config) -> None:
    if not state.measured:
        state.lines.append(f"nothing saved: no benchmark was timed (baseline {state.path} left as it was)")
        return
    old = None
    if state.path.is_file():
        try:
            old = baselines.load(state.path)
        except baselines.BaselineError as err:
            state.lines.append(f"the old baseline is unreadable and gets replaced: {err}")
    new, note = baselines.updated(old, _profile_name(config), _machine(config), state.measured)
    baselines.save(new, state.path)
    state.lines.append(f"saved {len(state.measured)} benchmarks to {state.path} ({note})")


def _compare(state: BenchState, config: pytest.Config) -> None:
    try:
        baseline = baselines.load(state.path)
    except FileNotFoundError:
        state.lines.append(f"no baseline for profile {_profile_name(config)} at {state.path}; "
                           "record one with --nsa-baseline=save")  # fmt: skip
        return
    except baselines.BaselineError as err:
        state.lines.append(f"baseline not compared: {err}")
        return
    diff = baselines.differences(baseline.machine, _machine(config))
    if diff:
        state.lines.append(f"baseline {state.path} refused: recorded on another device or software stack; "
                           f"differs in {'; '.join(diff)}")  # fmt: skip
        return
    settings = benchmark_settings(config)
    threshold, host_threshold = settings.regression_threshold_pct, settings.host_bound_threshold_pct
    state.rows = baselines.compare(baseline, state.measured, threshold, host_threshold)
    regressions = sum(1 for r in state.rows if r.verdict == baselines.REGRESSION)
    state.lines.append(f"compared with {state.path} (recorded {baseline.created or 'at an unknown time'}; "
                       f"threshold {threshold:g}% ({host_threshold:g}% where host-bound) and "
                       f"{baselines.SPREAD_FACTOR:g} x IQR)")  # fmt: skip
    state.lines.extend(baselines.table(state.rows))
    if regressions:
        state.failed = True
        state.lines.append(f"FAILED: {regressions} benchmark(s) regressed beyond the threshold and the spread")


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    if BENCH_KEY not in config.stash or hasattr(config, "workerinput"):
        return
    state = bench_state(config)
    if state.xdist:
        count = _benchmark_tests(config)
        if count:
            state.lines.append(f"timing disabled under pytest-xdist: {count} benchmark test(s) ran once, untimed, "
                               f"as smoke tests; nothing recorded or compared; {SERIAL_HINT}")  # fmt: skip
        return
    passed = _passed(config)
    state.measured = {b["fullname"]: baselines.Entry.from_stats(b, b.get("extra_info"))
                      for b in state.captured if passed.get(b["fullname"], False)}  # fmt: skip
    if not state.captured and state.enabled and _benchmark_tests(config):
        state.lines.append("benchmarks ran untimed (pytest-benchmark's timing is off, e.g. --benchmark-disable): "
                           "nothing recorded or compared")  # fmt: skip
    if state.mode == "off" or (not state.measured and state.mode == "compare"):
        return
    state.path = baselines.path_for(state.folder, _profile_name(config))
    (_save if state.mode == "save" else _compare)(state, config)
    if state.failed and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    if BENCH_KEY not in config.stash or not bench_state(config).lines:
        return
    state = bench_state(config)
    terminalreporter.section("nsa: benchmark baseline", sep="-", red=state.failed, bold=state.failed)
    for line in state.lines:
        terminalreporter.line(line)
