"""Decode step timings: NSA against dense SDPA at the profile's contexts and batch sizes.

Run with ``python -m pytest tests/benchmarks --nsa-bench`` (``--nsa-baseline=save`` records
the baseline of the active profile). On CUDA each point also runs as a CUDA-graph replay
where the decode route is capturable.
"""

from __future__ import annotations

import pytest
import torch
from _records import record, time_point

from nsa.bench.timing import TIMER
from nsa.bench.workloads import DECODE_OPS, Shape, decode_reads, decode_runner, default_config, graph_status
from nsa.bench.workloads import point_info, routes

pytestmark = pytest.mark.benchmark(group="decode", timer=TIMER)


def test_decode(benchmark, nsa_bench, decode_point):
    impl, mode, batch, context = decode_point
    device = nsa_bench.device
    shape, config = Shape.default(device, batch, context), default_config(device)
    if mode == "graph":
        ok, why = graph_status(impl, device, shape.dtype)
        if not ok:
            pytest.skip(why)
    with torch.no_grad():
        timed = time_point(benchmark, nsa_bench, impl,
                           lambda which: decode_runner(which, shape, config, device, graph=mode == "graph"))
        if timed is None:
            return
        actual, expected = decode_reads(shape, config, device) if impl == "nsa" else (float(context), context)
    route = routes(DECODE_OPS, device, shape.dtype) if impl == "nsa" else {"sdpa": "torch"}
    record(benchmark, nsa_bench, *timed, kind="decode", impl=impl, mode=mode, shape=point_info(shape, config),
           routes=route, tokens_read=actual, tokens_expected=expected)
    assert timed[0].median > 0
    if context % config.sel_block == 0:
        # Every selected block is full: the real selection reads exactly the spec's count.
        assert actual == expected, f"decode read {actual} tokens, the spec says {expected}"
