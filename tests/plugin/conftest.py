"""Shared pieces of the plugin's own tests: pytester, a clean environment, fake hardware.

Hardware is faked the documented way: a conftest in the pytester directory
implements ``pytest_nsa_detect_hardware`` (and ``pytest_nsa_detect_software``
where versions matter). Every test starts from an environment without ``NSA_``
flags, ``TRITON_INTERPRET``, CUDA pinning or xdist worker variables, so neither
the outer run's profile nor an outer xdist worker leaks into the runs under test.
"""

from __future__ import annotations

import os
import platform
from typing import Callable, Dict, Optional, Tuple

import pytest

from pytest_nsa.hardware import GPUInfo, HardwareInfo

# pytester itself is enabled in tests/conftest.py (pytest accepts pytest_plugins only there).

#: name, capability, memory as torch reports them for the shipped profiles' devices.
DEVICES: Dict[str, Tuple[str, Tuple[int, int], float]] = {
    "rtx3090": ("NVIDIA GeForce RTX 3090", (8, 6), 23.7),
    "rtx4090": ("NVIDIA GeForce RTX 4090", (8, 9), 23.6),
    "a100": ("NVIDIA A100-SXM4-80GB", (8, 0), 79.2),
    "h100": ("NVIDIA H100 80GB HBM3", (9, 0), 79.1),
    "h200": ("NVIDIA H200", (9, 0), 139.8),
}

#: Plugins the runs under test do without: the cache writes files, and hypothesis's
#: terminal summary imports all of hypothesis (seconds per run on a 2-core machine).
QUIET_PLUGINS = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest")
#: The runs under test ask for the plugin, passively (a run that gives none of its options is left
#: alone: ``lifecycle.engaged``); a test's own ``--gpu-profile`` comes later and wins.
ENGAGED = ("--gpu-profile=none",)

_SCRUB_PREFIXES = ("NSA_", "PYTEST_XDIST_", "PYTEST_NSA_")
_SCRUB_NAMES = ("TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES", "PYTEST_ADDOPTS")


def hardware_of(*names: str) -> HardwareInfo:
    """A :class:`HardwareInfo` with one GPU per name in :data:`DEVICES` (none: CPU only)."""
    gpus = tuple(GPUInfo(i, *DEVICES[n]) for i, n in enumerate(names))
    return HardwareInfo(gpus=gpus, driver="550.54.15" if gpus else None, cuda="12.4" if gpus else None)


FAKE_CONFTEST = '''
from pytest_nsa.hardware import GPUInfo, HardwareInfo

GPUS = {gpus!r}

def pytest_nsa_detect_hardware(config):
    gpus = tuple(GPUInfo(i, name, cap, mem) for i, (name, cap, mem) in enumerate(GPUS))
    return HardwareInfo(gpus=gpus, driver="550.54.15" if gpus else None, cuda="12.4" if gpus else None,
                        source="faked by conftest")
'''

FAKE_SOFTWARE = '''
from pytest_nsa.versions import SoftwareInfo

def pytest_nsa_detect_software(config):
    return SoftwareInfo(source="faked by conftest", **{fields!r})
'''


#: A stack whose Triton interpreter runs nsa's kernels (CI's: torch's CPU build, Triton 3.9), faked by the
#: runs under the cpu profile whose outcomes count ``triton`` tests: where the machine's own Triton is
#: older (the H200 machine's 3.6) the plugin rightly skips those tests, and the counts would follow the
#: machine, not the plugin.
INTERPRETER_STACK = {"python": platform.python_version(), "torch": "2.13.0+cpu", "triton": "3.9.0"}
#: A CUDA build's stack (the GPU machine's: torch 2.11 with the Triton it pins), for runs on faked GPUs
#: whose outcomes count ``triton`` tests: they then run wherever the suite runs, Triton installed or not.
GPU_STACK = {"python": platform.python_version(), "torch": "2.11.0", "triton": "3.6.0",
             "torch_triton_pin": "triton==3.6.0"}


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(_SCRUB_PREFIXES) or name in _SCRUB_NAMES:
            monkeypatch.delenv(name)


@pytest.fixture
def inprocess(pytester: pytest.Pytester) -> Callable[..., pytest.RunResult]:
    """``inprocess(*args, engaged=True)``: ``runpytest_inprocess``, of an engaged run (:data:`ENGAGED`)
    unless ``engaged`` is false, that also checks the run left ``os.environ`` as it found it (the
    profile's flags restored)."""

    def environ() -> Dict[str, str]:
        # pytest itself maintains PYTEST_CURRENT_TEST for the outer and the inner run.
        return {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}

    def run(*args: str, engaged: bool = True) -> pytest.RunResult:
        before = environ()
        result = pytester.runpytest_inprocess(*QUIET_PLUGINS, *(ENGAGED if engaged else ()), *args)
        assert environ() == before, "an in-process run left environment changes behind"
        return result

    return run


@pytest.fixture
def subprocess(pytester: pytest.Pytester) -> Callable[..., pytest.RunResult]:
    """``subprocess(*args, engaged=True)``: ``runpytest_subprocess``, of an engaged run (:data:`ENGAGED`)
    unless ``engaged`` is false, for runs that need a fresh process (import-time environment, xdist
    workers)."""

    def run(*args: str, engaged: bool = True) -> pytest.RunResult:
        return pytester.runpytest_subprocess(*QUIET_PLUGINS, *(ENGAGED if engaged else ()), *args)

    return run


@pytest.fixture
def interpreter_stack() -> Dict[str, str]:
    """:data:`INTERPRETER_STACK`, for ``fake(software=...)``."""
    return dict(INTERPRETER_STACK)


@pytest.fixture
def gpu_stack() -> Dict[str, str]:
    """:data:`GPU_STACK`, for ``fake(software=...)``."""
    return dict(GPU_STACK)


@pytest.fixture
def hw() -> Callable[..., HardwareInfo]:
    """``hw(*device names)``: see :func:`hardware_of`."""
    return hardware_of


@pytest.fixture
def fake(pytester: pytest.Pytester):
    """``fake(*device names, software=None, extra="", real_hardware=False)`` writes the faking conftest:
    the named GPUs (none: a CPU machine) unless ``real_hardware``, the ``software`` versions if given."""

    def write(*names: str, software: Optional[dict] = None, extra: str = "", real_hardware: bool = False) -> None:
        assert not (names and real_hardware), "fake: device names and real_hardware exclude each other"
        text = "" if real_hardware else FAKE_CONFTEST.format(gpus=[DEVICES[n] for n in names])
        if software is not None:
            text += FAKE_SOFTWARE.format(fields=software)
        pytester.makeconftest(text + extra)

    return write
