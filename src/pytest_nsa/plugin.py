"""pytest_nsa: does NSA work on this GPU and software stack? (``pytest11`` entry point)

Wiring only: options, hook registration and the calls into the modules that
decide (:mod:`~pytest_nsa.lifecycle`), judge markers (:mod:`~pytest_nsa.markers`)
and write text (:mod:`~pytest_nsa.summary`). State lives in ``config.stash``
(:mod:`~pytest_nsa.state`). Options::

    --gpu-profile NAME|auto|PATH|none   --gpu-profile-list   --gpu-profile-mismatch=error|skip

A run that gives none of the plugin's options (these, ``--nsa-bench``, ``--nsa-baseline*``,
``--nsa-report*``) is not engaged (:func:`~pytest_nsa.lifecycle.engaged`): the markers are
registered, the run's hooks (:class:`_RunHooks`) are not, so an unrelated project's run neither
imports torch nor changes.
"""

from __future__ import annotations

import os
import sys
from typing import List, Optional

import pytest

from pytest_nsa import gpu_memory, hookspecs, lifecycle, margins, sharing, summary, versions, xdist
from pytest_nsa.fixtures import nsa_device, nsa_gradcheck_tolerance, nsa_hardware, nsa_profile, nsa_tolerance
from pytest_nsa.hardware import HardwareInfo
from pytest_nsa.markers import MARKERS, RequirementError, skip_reason
from pytest_nsa.state import NSAState, get_state
from pytest_nsa.xdist import XdistHooks

HELP_PROFILE = (
    "GPU profile: a name from gpu_profiles/ (e.g. rtx4090), 'auto' (match the device; cpu "
    "without a GPU), a path to a profile YAML, or 'none' (detect the device and judge the markers, "
    "but apply no flags; the fixtures use the matching profile's values). Without any pytest_nsa "
    "option the plugin stays out of the run."
)
HELP_LIST = "List the known GPU profiles, one line each, and exit."
HELP_MISMATCH = (
    "When the named profile does not match the device: 'error' (default) stops the run; "
    "'skip' runs anyway with the GPU tests skipped and says why."
)

# --nsa-bench, --nsa-report: plugins of their own; benchmarks first, since report imports it
# and pytest can only assert-rewrite a plugin it imports itself.
pytest_plugins = ["pytest_nsa.benchmarks", "pytest_nsa.report"]

__all__ = ["nsa_device", "nsa_gradcheck_tolerance", "nsa_hardware", "nsa_profile", "nsa_tolerance"]


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("nsa", "NSA GPU profiles (pytest_nsa)")
    group.addoption("--gpu-profile", dest="gpu_profile", default=None, metavar="NAME|auto|PATH", help=HELP_PROFILE)
    group.addoption("--gpu-profile-list", dest="gpu_profile_list", action="store_true", help=HELP_LIST)
    # default None, not "error": given at all, it engages the plugin (lifecycle.engaged)
    group.addoption("--gpu-profile-mismatch", dest="gpu_profile_mismatch", default=None,
                    choices=("error", "skip"), help=HELP_MISMATCH)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    lifecycle.early(early_config)


@pytest.hookimpl(trylast=True)
def pytest_nsa_detect_hardware(config: pytest.Config) -> HardwareInfo:
    return lifecycle.real_hardware(config)


@pytest.hookimpl(trylast=True)
def pytest_nsa_detect_software(config: pytest.Config) -> versions.SoftwareInfo:
    return versions.detect()


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> Optional[int]:
    if not config.option.gpu_profile_list:
        return None
    for line in summary.profile_list(lifecycle.catalog_for(config)):
        print(line)
    return 0


def pytest_configure(config: pytest.Config) -> None:
    for text in MARKERS.values():
        config.addinivalue_line("markers", text)
    if config.option.help or config.option.version or not lifecycle.start(config).engaged:
        return
    lifecycle.configure(config)
    state = get_state(config)
    # the run's hooks exist only in an engaged run: a run that is not has none to skip
    config.pluginmanager.register(_RunHooks(state), "pytest_nsa_run")
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(XdistHooks(state.workers), "pytest_nsa_xdist")


_MEMORY_AT_START = pytest.StashKey[Optional[gpu_memory.Start]]()


class _RunHooks:
    """The hooks of an engaged run: header, skips, each test's memory and parity margins, its
    results (workers' too, on the xdist controller), and the terminal summary."""

    def __init__(self, state: NSAState) -> None:
        self.state = state

    @pytest.hookimpl(trylast=True)  # its lines before pytest-benchmark's, as when this was a module hook
    def pytest_report_header(self, config: pytest.Config) -> List[str]:
        return summary.header(self.state)

    def pytest_collection_modifyitems(self, config: pytest.Config, items: List[pytest.Item]) -> None:
        ctx = self.state.context
        for item in items:
            marks = [(m.name, m.args, m.kwargs) for m in item.iter_markers() if m.name in MARKERS]
            try:
                reason = skip_reason(marks, ctx)
            except RequirementError as err:
                raise pytest.UsageError(f"{item.nodeid}: {err}") from None
            if reason is not None:
                item.add_marker(pytest.mark.skip(reason=reason))
        sharing.whole_device_tests_last(items, self.state.pin, os.environ)

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item):  # type: ignore[no-untyped-def]
        """Start the test's GPU memory measurement (:mod:`~pytest_nsa.gpu_memory`)."""
        item.stash[_MEMORY_AT_START] = gpu_memory.start()
        yield

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: Optional[pytest.Item]):  # type: ignore[no-untyped-def]
        """After the fixtures are gone and before the teardown report: what the test took."""
        yield
        measured = gpu_memory.measure(item.stash.get(_MEMORY_AT_START, None), sharing.needs_whole_device(item))
        if measured is not None:
            item.user_properties.append((gpu_memory.PROPERTY, measured))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: pytest.Item):  # type: ignore[no-untyped-def]
        """Record every ``nsa.testing.assert_close`` of a ``parity`` test (:mod:`~pytest_nsa.margins`)."""
        # Only parity tests: elsewhere a failing comparison may be the point (tests of the helpers).
        # Where no test module imported nsa.testing, nothing can compare: torch stays unimported.
        testing = sys.modules.get("nsa.testing")
        if testing is None or item.get_closest_marker("parity") is None:
            yield
            return
        with testing.record_comparisons() as found:
            yield
        if found:
            item.user_properties.append((margins.PROPERTY, margins.encode(found)))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.state.results.record(report)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        output = getattr(session.config, "workeroutput", None)
        if output is not None:  # an xdist worker: tell the controller where it ran
            state = self.state
            pin = state.pin.describe() if state.pin is not None else "not pinned"
            threads = f"; {state.cpu_threads} CPU thread(s)" if state.cpu_threads is not None else ""
            turns = f"; {state.turns.describe()}" if state.turns is not None else ""
            hw = state.hardware.describe() if state.hardware else "no hardware record"
            output["pytest_nsa"] = f"{pin}{threads}; {hw}{turns}"

    @pytest.hookimpl(trylast=True)  # after the report's and the baseline's sections, as when these were module hooks
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
        state = self.state
        sections = (
            ("nsa: skipped tests by reason", summary.skip_summary(state)),
            ("nsa: parity margins (relative error against each assert_close bound)",
             margins.terminal_lines(margins.summary(state.results.finished()))),
            ("nsa: GPU memory per test", gpu_memory.terminal_lines(
                gpu_memory.summary(state.results.finished(), state.memory_share_gib(xdist.workers(config))))),
            ("nsa: xdist workers", summary.worker_summary(state)),
        )
        for title, lines in sections:
            if lines:
                terminalreporter.section(title, sep="-")
                for line in lines:
                    terminalreporter.line(line)
