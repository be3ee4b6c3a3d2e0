"""What each test took of the GPU's memory (``pytest_nsa.gpu_memory``): measured around every
test, carried from xdist workers, summarised in the terminal and the report.

No GPU here: the runs under test replace torch.cuda's allocator statistics with counters that
their tests move by hand, so every figure the plugin reports is known in advance.
"""

from __future__ import annotations

import json
import textwrap

from pytest_nsa import gpu_memory
from pytest_nsa.state import TestOutcome

GIB = 2**30

#: conftest of the runs under test: torch.cuda's statistics as counters; ``gpu(gib)`` allocates
#: (a negative amount frees).
FAKE_ALLOCATOR = '''
import pytest
import torch


class Counters:
    allocated = 0
    peak = 0


def _reset(device=None):
    Counters.peak = Counters.allocated


torch.cuda.is_initialized = lambda: True
torch.cuda.memory_allocated = lambda device=None: Counters.allocated
torch.cuda.max_memory_allocated = lambda device=None: Counters.peak
torch.cuda.reset_peak_memory_stats = _reset
torch.cuda.empty_cache = lambda: None


@pytest.fixture
def gpu():
    def take(gib):
        Counters.allocated += int(gib * 2**30)
        Counters.peak = max(Counters.peak, Counters.allocated)
    return take
'''

TESTS = '''
import pytest

def test_small(gpu):
    gpu(2)
    gpu(-2)

def test_big_beside_others(gpu):
    gpu(50)
    gpu(-50)

@pytest.mark.requires(memory_gib=60)
def test_big_alone(gpu):
    gpu(55)
    gpu(-55)

def test_leaky(gpu):
    gpu(1)
'''


def test_each_test_is_measured_and_the_hungry_and_leaky_ones_named(pytester, fake, subprocess, monkeypatch):
    """Two workers on one faked A100 (79.2 GiB, 39.6 each): the test that peaks at 50 GiB beside
    others is named for a ``requires(memory_gib=...)`` mark, the one marked to run alone is not,
    the one that keeps 1 GiB is named, in the terminal and in the report."""
    fake("a100", extra=FAKE_ALLOCATOR)
    monkeypatch.setenv("PYTEST_NSA_GPU_POOL", "0")
    pytester.makepyfile(test_memory=TESTS)
    result = subprocess("-n", "2", "--gpu-profile", "a100", "--nsa-report=out", "-m", "not benchmark")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines([
        "*nsa: GPU memory per test*",
        "4 tests used the GPU; the largest peak: 5?.00 GiB, test_memory.py::test_big_alone (ran alone)",
        "peaked at 5?.00 GiB beside other tests (share 39.60 GiB): test_memory.py::test_big_beside_others; "
        "mark it requires(memory_gib=...) to run it alone",
        "left 1.00 GiB allocated after its teardown: test_memory.py::test_leaky",
    ])
    (folder,) = (pytester.path / "out").iterdir()
    results = json.loads((folder / "results.json").read_text())
    memory = results["gpu_memory"]
    assert memory["tests"] == 4 and memory["share_gib"] == 39.6
    assert [r["nodeid"] for r in memory["over_share"]] == ["test_memory.py::test_big_beside_others"]
    assert [(r["nodeid"], r["kept_gib"]) for r in memory["kept"]] == [("test_memory.py::test_leaky", 1.0)]
    assert memory["largest"][0]["nodeid"] == "test_memory.py::test_big_alone" and memory["largest"][0]["alone"]
    per_test = {t["nodeid"]: t["gpu_memory"] for t in results["tests"]}
    small = per_test["test_memory.py::test_small"]
    assert small["peak_gib"] - small["start_gib"] == 2.0 and small["left_gib"] == small["start_gib"]
    md = (folder / "report.md").read_text()
    assert "## GPU memory" in md and "**Above their share beside other tests**" in md
    assert "| `test_memory.py::test_leaky` | 1.0 | 1.0 | 0.0 | no |" in md


def _outcome(name: str, peak: float, start: float, left: float, alone: bool = False, local: float = 0.0) -> TestOutcome:
    return TestOutcome(name, "passed",
                       gpu_memory=(int(peak * GIB), int(start * GIB), int(left * GIB), alone, int(local * GIB)))


def test_summary_without_sharing_names_no_test_over_a_share():
    outcomes = [_outcome("a", 30, 0, 0), _outcome("b", 70, 0, 0), _outcome("c", 1, 0.5, 0.5, local=13.7),
                _outcome("d", 1, 0, 0, local=0.5), TestOutcome("cpu only", "passed")]
    memory = gpu_memory.summary(outcomes, share_gib=None, largest=2)
    assert memory["tests"] == 4 and memory["over_share"] == [] and memory["kept"] == []
    assert [(r["nodeid"], r["local_gib"]) for r in memory["local"]] == [("c", 13.7)]
    assert any("reserve 13.70 GiB of local memory" in line for line in gpu_memory.terminal_lines(memory))
    assert [r["nodeid"] for r in memory["largest"]] == ["b", "a"]
    shared = gpu_memory.summary(outcomes, share_gib=20.0)
    assert [r["nodeid"] for r in shared["over_share"]] == ["b", "a"]


def test_share_of_device_counts_the_workers_on_each_gpu():
    assert gpu_memory.share_of_device(80.0, gpus=1, workers=12) == 80.0 / 12
    assert gpu_memory.share_of_device(80.0, gpus=2, workers=3) == 40.0  # two workers on one of them
    assert gpu_memory.share_of_device(80.0, gpus=2, workers=2) is None  # a GPU each
    assert gpu_memory.share_of_device(None, gpus=1, workers=4) is None
    assert gpu_memory.share_of_device(80.0, gpus=0, workers=4) is None


def test_no_measurement_without_torch_cuda_in_use(monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert gpu_memory.start() is None and gpu_memory.measure(None, alone=False) is None
    assert gpu_memory.terminal_lines(gpu_memory.summary([], None)) == []


def test_report_of_an_older_plugin_says_it_did_not_measure():
    from pytest_nsa.report_md import _gpu_memory

    assert "Not measured" in "\n".join(_gpu_memory({}))
    text = textwrap.dedent("\n".join(_gpu_memory({"gpu_memory": gpu_memory.summary([], None)})))
    assert "No test used the GPU" in text


class _FakeDriver:
    """libcuda's cuCtxGetLimit / cuCtxSetLimit on a stack limit held here."""

    def __init__(self, stack: int) -> None:
        self.stack, self.calls = stack, []

    def cuCtxGetLimit(self, out, limit):  # noqa: N802 - the driver's name
        out._obj.value = self.stack
        return 0

    def cuCtxSetLimit(self, limit, value):  # noqa: N802
        self.calls.append(value.value)
        self.stack = value.value
        return 0


def test_spilling_kernels_local_memory_is_measured_and_given_back(monkeypatch):
    """A test during which the driver's stack limit grew is charged the local memory that limit
    keeps on every thread of the GPU (H100: 2048 threads an SM, 132 SMs); resetting the limit
    goes back to CUDA's default, and does nothing where the limit never grew."""
    import sys
    import types

    props = types.SimpleNamespace(max_threads_per_multi_processor=2048, multi_processor_count=132)
    cuda = types.SimpleNamespace(is_initialized=lambda: True, reset_peak_memory_stats=lambda: None,
                                 memory_allocated=lambda: 0, max_memory_allocated=lambda: 3 * GIB,
                                 current_device=lambda: 0, get_device_properties=lambda index: props)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    driver = _FakeDriver(gpu_memory.DEFAULT_STACK)
    monkeypatch.setattr(gpu_memory, "_libcuda", lambda: driver)
    begun = gpu_memory.start()
    assert begun == (0, gpu_memory.DEFAULT_STACK)
    driver.stack = 52368  # a float32 kernel at head dim 192 spilled
    measured = gpu_memory.measure(begun, alone=False)
    assert measured == (3 * GIB, 0, 0, False, 52368 * 2048 * 132)
    assert gpu_memory.as_json(measured)["local_gib"] == 13.185
    # the next test starts from the grown limit: its kernels needed no more, so it is charged nothing
    assert gpu_memory.measure(gpu_memory.start(), alone=False)[4] == 0
    assert gpu_memory.reset_driver_stack() and driver.calls == [gpu_memory.DEFAULT_STACK]
    assert not gpu_memory.reset_driver_stack() and driver.calls == [gpu_memory.DEFAULT_STACK]
