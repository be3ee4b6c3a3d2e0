"""The benchmark suites: points from the active profile's ``benchmark`` section.

Benchmarks are opt-in (``--nsa-bench``, see :mod:`pytest_nsa.benchmarks`). The
allocation poisoning of ``tests/conftest.py`` is switched off here: it fills every
``torch.empty`` with NaN, an extra kernel per allocation inside the timed region.
"""

from __future__ import annotations

from typing import Iterator, List, NamedTuple

import pytest

from pytest_nsa.benchmarks import benchmark_settings, uses_gpu


class DecodePoint(NamedTuple):
    impl: str  # "nsa" or "dense"
    mode: str  # "eager" or "graph" (CUDA-graph replay)
    batch: int
    context: int

    @property
    def id(self) -> str:
        return f"{self.impl}-{self.mode}-B{self.batch}-S{self.context}"


class PrefillPoint(NamedTuple):
    impl: str  # "nsa" or "dense"
    mode: str  # "fwd" or "fwd+bwd"
    length: int

    @property
    def id(self) -> str:
        return f"{self.impl}-{self.mode}-T{self.length}"


@pytest.fixture(autouse=True)
def _poison_empty() -> Iterator[None]:
    """Overrides the NaN poisoning of tests/conftest.py (it would be timed)."""
    yield


def _decode_points(config: pytest.Config) -> List[DecodePoint]:
    settings = benchmark_settings(config)
    modes = ("eager", "graph") if uses_gpu(config) else ("eager",)
    return [DecodePoint(impl, mode, batch, context) for batch in settings.batch_sizes for context in settings.contexts
            for mode in modes for impl in ("nsa", "dense")]  # fmt: skip


def _prefill_points(config: pytest.Config) -> List[PrefillPoint]:
    return [PrefillPoint(impl, mode, length) for length in benchmark_settings(config).prefill_lengths
            for mode in ("fwd", "fwd+bwd") for impl in ("nsa", "dense")]  # fmt: skip


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    for name, points in (("decode_point", _decode_points), ("prefill_point", _prefill_points)):
        if name in metafunc.fixturenames:
            values = points(metafunc.config)
            metafunc.parametrize(name, values, ids=[p.id for p in values])
