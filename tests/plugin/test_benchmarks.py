"""pytest_nsa.benchmarks through pytester: opt-in, save, compare, regressions, refusals, xdist.

The runs under test time ``time.sleep`` through the same path as the real suites
(:func:`nsa.bench.timing.run_pedantic` with the pair timer), so the numbers are real
and a tenfold slower sleep is a regression whatever the machine's noise.
"""

from __future__ import annotations

import json
from typing import Optional

import pytest

from nsa.bench import baselines

BENCH_TEST = '''
import time

import pytest
import torch

from nsa.bench.timing import TIMER, Runner, run_pedantic

@pytest.mark.benchmark(timer=TIMER)
def test_sleep(benchmark, nsa_bench):
    runner = Runner(lambda: time.sleep({delay}), [()], torch.device("cpu"))
    samples = run_pedantic(benchmark, runner, rounds=5, warmup=1)
    benchmark.extra_info.update(nsa_bench.machine, shape={{"length": {length}}}, host_share={host_share})
    if samples is not None:
        assert samples.median >= {delay}

def test_plain():
    pass
'''


@pytest.fixture(autouse=True)
def _no_gpu(fake):
    """These runs test the baseline machinery on the cpu profile, also on a GPU machine."""
    fake()


@pytest.fixture
def suite(pytester):
    def write(delay: float, length: int = 1, host_share: Optional[float] = None) -> None:
        pytester.makepyfile(test_bench=BENCH_TEST.format(delay=delay, length=length, host_share=host_share))

    return write


@pytest.fixture
def baseline_file(pytester):
    return pytester.path / "gpu_profiles" / "baselines" / "cpu" / "benchmarks.json"


def test_benchmarks_are_opt_in(pytester, suite, inprocess):
    suite(0.001)
    result = inprocess("-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*benchmarks run only with --nsa-bench (or --nsa-baseline=save)*"])
    result.stdout.no_fnmatch_line("*nsa: benchmark baseline*")


def test_missing_baseline_is_reported_not_an_error(pytester, suite, inprocess, baseline_file):
    suite(0.001)
    result = inprocess("--nsa-bench")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*nsa: benchmark baseline*", f"no baseline for profile cpu at {baseline_file}*"])


def test_save_then_compare_then_planted_regression_fails(pytester, suite, inprocess, baseline_file):
    suite(0.005)
    saved = inprocess("--nsa-baseline=save")
    assert saved.ret == 0
    saved.stdout.fnmatch_lines([f"saved 1 benchmarks to {baseline_file} (new baseline with 1 benchmarks)"])
    stored = json.loads(baseline_file.read_text())
    entry = stored["benchmarks"]["test_bench.py::test_sleep"]
    assert entry["median"] >= 0.005 and entry["rounds"] >= 3 and stored["machine"]["profile"] == "cpu"
    assert entry["info"]["shape"] == {"length": 1} and stored["machine"]["device"].startswith("CPU ")

    suite(0.05)  # ten times slower
    slow = inprocess("--nsa-bench")
    assert slow.ret == pytest.ExitCode.TESTS_FAILED
    slow.stdout.fnmatch_lines([
        "*nsa: benchmark baseline*",
        f"compared with {baseline_file}*",
        "benchmark*baseline*now*change*verdict",
        "test_bench.py::test_sleep*ms*ms*+*%*REGRESSION (limit*",
        "FAILED: 1 benchmark(s) regressed beyond the threshold and the spread",
    ])  # fmt: skip
    assert json.loads(baseline_file.read_text()) == stored  # compare never writes


def test_host_bound_benchmark_is_judged_by_its_own_threshold(pytester, suite, inprocess, baseline_file):
    """A benchmark recorded as host-bound (host share 0.9) may run twice as long as its baseline
    (the host machine's speed and state move it so) and is marked; four times as long fails."""
    suite(0.005, host_share=0.9)
    assert inprocess("--nsa-baseline=save").ret == 0
    suite(0.010, host_share=0.9)
    doubled = inprocess("--nsa-bench")
    assert doubled.ret == 0
    doubled.stdout.fnmatch_lines(["compared with*threshold 25% (150% where host-bound) and 1.5 x IQR)",
                                  "test_bench.py::test_sleep*ms*ms*+*%*ok, host-bound"])  # fmt: skip
    suite(0.020, host_share=0.9)
    quadrupled = inprocess("--nsa-bench")
    assert quadrupled.ret == pytest.ExitCode.TESTS_FAILED
    quadrupled.stdout.fnmatch_lines(["test_bench.py::test_sleep*ms*ms*+*%*REGRESSION (limit*), host-bound"])


def test_improvement_never_fails(pytester, suite, inprocess):
    suite(0.05)
    assert inprocess("--nsa-baseline=save").ret == 0
    suite(0.005)
    fast = inprocess("--nsa-bench")
    assert fast.ret == 0
    fast.stdout.fnmatch_lines(["test_bench.py::test_sleep*-*%*improved"])


def test_changed_shape_is_listed_not_judged(pytester, suite, inprocess):
    suite(0.005, length=1)
    assert inprocess("--nsa-baseline=save").ret == 0
    suite(0.05, length=2)
    result = inprocess("--nsa-bench")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["test_bench.py::test_sleep*shape changed"])


def test_save_updates_and_off_does_nothing(pytester, suite, inprocess, baseline_file):
    suite(0.002)
    inprocess("--nsa-baseline=save")
    first = json.loads(baseline_file.read_text())
    saved = inprocess("--nsa-baseline=save")
    saved.stdout.fnmatch_lines(["saved 1 benchmarks to * (updated 1, kept 0 from the earlier run)"])
    off = inprocess("--nsa-bench", "--nsa-baseline=off")
    assert off.ret == 0
    off.stdout.no_fnmatch_line("*nsa: benchmark baseline*")
    assert json.loads(baseline_file.read_text())["created"] >= first["created"]


def test_baseline_from_another_stack_is_refused_naming_the_field(pytester, suite, inprocess, fake, baseline_file):
    suite(0.002)
    fake(software={"python": "3.11.7", "torch": "2.4.1", "triton": "3.0.0"})
    assert inprocess("--nsa-baseline=save").ret == 0
    assert json.loads(baseline_file.read_text())["machine"]["torch"] == "2.4.1"
    fake()  # the real software from here on, still no GPU
    result = inprocess("--nsa-bench")
    assert result.ret == 0
    result.stdout.fnmatch_lines([f"baseline {baseline_file} refused: recorded on another device or software stack;"
                                 " differs in torch ('2.4.1' in the baseline, *"])  # fmt: skip


def test_unreadable_baseline_is_reported(pytester, suite, inprocess, baseline_file):
    suite(0.002)
    baseline_file.parent.mkdir(parents=True)
    baseline_file.write_text('{"schema": 0}')
    result = inprocess("--nsa-bench")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["baseline not compared: *schema 0 is not the one this nsa reads (1)"])


def test_baseline_dir_option(pytester, suite, inprocess, tmp_path):
    suite(0.002)
    inprocess("--nsa-baseline=save", f"--nsa-baseline-dir={tmp_path / 'elsewhere'}")
    assert baselines.load(tmp_path / "elsewhere" / "cpu" / "benchmarks.json").entries


def test_machine_info_of_pytest_benchmark_names_the_device(pytester, suite, inprocess):
    suite(0.002)
    inprocess("--nsa-bench", "--benchmark-json=out.json")
    info = json.loads((pytester.path / "out.json").read_text())["machine_info"]["nsa"]
    assert info["profile"] == "cpu" and set(baselines.IDENTITY) == set(info)


def test_xdist_disables_timing_with_a_message(pytester, suite, subprocess, baseline_file):
    suite(0.002)
    result = subprocess("-n", "1", "--nsa-bench")  # one worker is xdist all the same (and one import fewer)
    assert result.ret == 0
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*timing disabled under pytest-xdist: 1 benchmark test(s) ran once, untimed, as smoke"
                                 " tests; nothing recorded or compared; time them serially*"])  # fmt: skip
    assert not baseline_file.exists()
    refused = subprocess("-n", "1", "--nsa-baseline=save")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["*--nsa-baseline=save: pytest-xdist disables benchmark timing*"])
