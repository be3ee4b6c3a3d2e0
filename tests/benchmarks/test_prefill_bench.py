"""Prefill timings, forward and forward+backward: NSA against dense causal SDPA at the
profile's prefill lengths (batch 1). Run with ``python -m pytest tests/benchmarks --nsa-bench``."""

from __future__ import annotations

import pytest
from _records import record, time_point

from nsa.bench.timing import TIMER
from nsa.bench.workloads import PREFILL_OPS, Shape, default_config, point_info, prefill_runner, routes

pytestmark = pytest.mark.benchmark(group="prefill", timer=TIMER)


def test_prefill(benchmark, nsa_bench, prefill_point):
    impl, mode, length = prefill_point
    device = nsa_bench.device
    shape, config = Shape.default(device, 1, length), default_config(device)
    backward = mode == "fwd+bwd"
    timed = time_point(benchmark, nsa_bench, impl,
                       lambda which: prefill_runner(which, shape, config, device, backward=backward))
    if timed is None:
        return
    route = routes(PREFILL_OPS, device, shape.dtype) if impl == "nsa" else {"sdpa": "torch"}
    record(benchmark, nsa_bench, *timed, kind="prefill", impl=impl, mode=mode, shape=point_info(shape, config),
           routes=route)
    assert timed[0].median > 0
