"""Test-wide setup: reproducible per-test seeds, NaN-poisoned allocations, a faster interpreter.

Every float tensor made by ``torch.empty``/``torch.empty_like``/``Tensor.new_empty``
during a test is filled with NaN, so an output element that a kernel forgets to
write fails the comparison loudly instead of passing with stale memory; every integer
one with its dtype's largest value, far from any index, length or key a kernel writes. Triton's CPU
interpreter stops re-patching its language at every ``@triton.jit`` helper call, checking integer
overflows that it never asserts, and rebuilding a dtype table (:mod:`_interpreter`), which takes
more than half off the suite's time on a CPU.
"""

from __future__ import annotations

import zlib

import pytest
import torch

import _interpreter

_interpreter.install()

# The plugin's own tests (tests/plugin) drive pytest through pytester; pytest only
# accepts pytest_plugins in the top-level conftest.
pytest_plugins = ["pytester"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("nsa-fuzz", "nsa's differential fuzzing (tests/test_fuzz.py)")
    group.addoption("--fuzz-cases", type=int, default=4, metavar="N",
                    help="random nsa_attention problems to check against the reference (default 4)")
    group.addoption("--fuzz-seed", type=int, default=0, metavar="S",
                    help="seed of the first case; case i is seed S + i (default 0)")


@pytest.fixture(autouse=True)
def _seed(request: pytest.FixtureRequest) -> None:
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


def _poisoned(factory):
    def make(*args, **kwargs):
        out = factory(*args, **kwargs)
        if out.is_floating_point():
            # no_grad: torch's own empty leaves that require grad (checkpoint's, in torch 2.11)
            # may be filled too
            with torch.no_grad():
                out.fill_(float("nan"))
        elif out.dtype != torch.bool and not out.is_complex():
            out.fill_(torch.iinfo(out.dtype).max)
        return out

    return make


@pytest.fixture(autouse=True)
def _poison_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "empty", _poisoned(torch.empty))
    monkeypatch.setattr(torch, "empty_like", _poisoned(torch.empty_like))
    monkeypatch.setattr(torch.Tensor, "new_empty", _poisoned(torch.Tensor.new_empty))
