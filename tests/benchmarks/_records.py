"""Shared steps of the benchmark tests: time a point through pytest-benchmark, time dense
SDPA beside it for the ratio, check the output, and fill ``extra_info``."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Tuple

import torch

from nsa.bench.timing import Runner, Samples, measure_within, run_pedantic
from pytest_nsa.benchmarks import BenchContext


def _check_finite(runner: Runner) -> None:
    """The measured call produces finite numbers (a fast garbage result is no result)."""
    if runner.graph:
        return  # replays write the graph's own buffers; the eager point checks the same call
    out = runner.fn(*runner.input_sets[0])
    for t in out if isinstance(out, tuple) else (out,):
        assert torch.isfinite(t).all(), f"non-finite output of shape {list(t.shape)}"


def time_point(benchmark: Any, bench: BenchContext, impl: str,
               runner_of: Callable[[str], Runner]) -> Optional[Tuple[Samples, Samples, Optional[float]]]:  # fmt: skip
    """``(samples, dense samples, host share)`` of ``impl`` (``runner_of(impl)``) through
    pytest-benchmark, dense measured the same way in the same run (``samples`` twice for dense
    itself), the host share that of ``samples`` (:meth:`Runner.host_share`); ``None`` when
    pytest-benchmark's timing is off (the call ran once as a smoke test)."""
    runner = runner_of(impl)
    samples = run_pedantic(benchmark, runner, rounds=bench.settings.rounds, warmup=bench.warmup,
                           budget_s=bench.budget_s)  # fmt: skip
    _check_finite(runner)
    if samples is None:
        return None
    host_share = runner.host_share(samples)
    if impl == "dense":
        return samples, samples, host_share
    del runner  # free its input sets before dense allocates its own
    dense = measure_within(runner_of("dense"), rounds=len(samples.times), warmup=bench.warmup, budget_s=bench.budget_s)
    return samples, dense, host_share


def record(benchmark: Any, bench: BenchContext, samples: Samples, dense: Samples, host_share: Optional[float],
           **info: Any) -> None:
    """``extra_info``: the machine fields, ``info`` (kind, impl, mode, shape, routes, ...), the
    timing method, the NSA/dense ratio of medians measured in this run, and the host's share of
    the samples (``None`` where they hold no host time: replays, the CPU), by which the baseline
    comparison judges a host-bound benchmark (:func:`nsa.bench.baselines.host_bound`)."""
    extra: Mapping[str, Any] = {
        **bench.machine, **info, "timing": samples.method, "median_s": samples.median,
        "dense_median_s": dense.median, "nsa_over_dense": samples.median / dense.median, "host_share": host_share,
    }  # fmt: skip
    benchmark.extra_info.update(extra)
