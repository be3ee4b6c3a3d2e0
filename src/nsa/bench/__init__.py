"""nsa.bench: timing NSA against dense attention, truthfully.

- :mod:`~nsa.bench.timing`: CUDA-event / ``perf_counter`` samples, warm-up excluded,
  L2 flushed and inputs rotated, optional CUDA-graph replay.
- :mod:`~nsa.bench.workloads`: the decode step and prefill (NSA, dense SDPA, each
  NSA branch alone) built from one :class:`~nsa.bench.workloads.Shape`, and packs of
  documents (``cu_seqlens``) against dense attention over the same pack.
- :mod:`~nsa.bench.baselines`: the per-profile baseline files and the comparison.
- :mod:`~nsa.bench.cli`: the ``nsa-bench`` command (tables, CSV, plots).

The pytest side (options, ``extra_info``, baselines at session end) is
:mod:`pytest_nsa.benchmarks`; the suites are in ``tests/benchmarks``.
"""
