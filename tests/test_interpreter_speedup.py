"""The test suite's interpreter speed-up (``tests/_interpreter.py``) is in place and changes
nothing but time: nested ``@triton.jit`` helpers compute what they did, the language is patched
once per launch, and a launch still restores it."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from nsa.routing import triton_interpreter_on

needs_interpreter = pytest.mark.skipif(not triton_interpreter_on(), reason="checks Triton's CPU interpreter (TRITON_INTERPRET=1)")


@triton.jit
def _scaled(x, c):
    return x * c


@triton.jit
def _row_total(x):
    return tl.sum(x, 0)  # tl.sum is a jit function of triton.language.standard, which calls core


@triton.jit
def _helpers_kernel(x, out, N: tl.constexpr, CALLS: tl.constexpr):
    o = tl.arange(0, N)
    b = tl.load(x + tl.program_id(0) * N + o)
    acc = tl.zeros([N], tl.float32)
    for i in tl.static_range(CALLS):
        acc += _scaled(b, i + 1.0)
    tl.store(out + tl.program_id(0), _row_total(acc))


def _run(x: torch.Tensor, calls: int) -> torch.Tensor:
    out = torch.empty(x.shape[0], dtype=torch.float32)
    _helpers_kernel[(x.shape[0],)](x, out, N=x.shape[1], CALLS=calls)
    return out


def test_the_suite_runs_with_the_speedup_installed():
    """If Triton renames what the speed-up wraps, it quietly stands aside; this says so."""
    from triton.runtime import interpreter

    assert getattr(interpreter._patch_lang, "_nsa_cached", False), "tests/_interpreter.py did not install"


@needs_interpreter
def test_nested_helpers_compute_the_same_and_the_language_is_restored():
    x = torch.randn(3, 16)
    calls = 5
    want = (x * sum(range(1, calls + 1))).sum(1)
    torch.testing.assert_close(_run(x, calls), want, rtol=1e-6, atol=1e-6)
    assert tl.core.is_builtin(tl.load) and tl.core.is_builtin(tl.tensor.__add__), "a launch left tl patched"


@needs_interpreter
def test_the_language_is_patched_once_per_launch(monkeypatch):
    """Eight helper calls a program, three programs: the language's members are walked for the
    launch and for the first calls that see a module not yet patched (10 walks with Triton 3.9),
    not at every helper call (145 walks without the speed-up)."""
    from triton.runtime import interpreter

    walks = []
    walk = interpreter._patch_builtin
    monkeypatch.setattr(interpreter, "_patch_builtin", lambda *a, **k: (walks.append(a[0]), walk(*a, **k))[1])
    _run(torch.randn(3, 16), calls=8)
    assert 0 < len(walks) <= 16, f"{len(walks)} walks of the language's members for one launch"
