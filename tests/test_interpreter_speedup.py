"""The test suite's interpreter speed-up (``tests/_interpreter.py``) is in place and changes
nothing but time: nested ``@triton.jit`` helpers compute what they did, the language is patched
once per launch, and a launch still restores it; integer arithmetic gives the same values without
the overflow checks, and the NumPy dtypes looked up are those the interpreter computes."""

from __future__ import annotations

import pytest
import torch

from nsa.routing import TRITON_MISSING, triton_interpreter_on

pytest.importorskip("triton", reason=TRITON_MISSING)

import triton
import triton.language as tl

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
    assert getattr(interpreter._get_np_dtype, "_nsa_cached", False), "_get_np_dtype is not looked up"
    assert interpreter.interpreter_builder.options.sanitize_overflow is False, "the overflow checks still run"


@triton.jit
def _offsets_kernel(x, out, stride, N: tl.constexpr):
    row = tl.program_id(0)
    o = tl.arange(0, N)
    tl.store(out + row * N + o, row * stride + o * 3 - tl.load(x + row * N + o))


@needs_interpreter
def test_integer_arithmetic_is_the_same_without_the_overflow_checks(monkeypatch):
    """32-bit products, sums and differences (as offsets are computed) give the same values with the
    interpreter's overflow checks and without them (the speed-up's setting). The checks assert only
    under ``debug=True``, where a product past 2**31 fails; without it (the suite's runs) they
    compute and assert nothing."""
    import dataclasses

    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder

    def run(stride: int, checked: bool, debug: bool = False) -> torch.Tensor:
        monkeypatch.setattr(builder, "options", dataclasses.replace(builder.options, sanitize_overflow=checked,
                                                                    debug=debug))
        out = torch.empty(4, 16, dtype=torch.int32)
        _offsets_kernel[(4,)](x, out, stride, N=16)
        return out

    x = torch.randint(-1000, 1000, (4, 16), dtype=torch.int32)
    want = (torch.arange(4)[:, None] * (1 << 20) + torch.arange(16) * 3 - x).int()
    assert torch.equal(run(1 << 20, checked=False), want) and torch.equal(run(1 << 20, checked=True), want)
    assert torch.equal(run(1 << 20, checked=True, debug=True), want)
    assert torch.equal(run(1 << 30, checked=True), run(1 << 30, checked=False))  # wrapped alike, unasserted
    with pytest.raises(Exception, match="int32 overflow detected for operation mul"):  # in an InterpreterError
        run(1 << 30, checked=True, debug=True)


def test_numpy_dtypes_are_those_the_interpreter_computes():
    """Scalar, block, pointer and block-of-pointer types: the table answers as the interpreter's own
    function does, and block types that differ only in shape share an answer."""
    from triton.runtime import interpreter

    looked_up = interpreter._get_np_dtype
    computed = getattr(looked_up, "__wrapped__", None)
    assert computed is not None, "the looked-up function keeps the interpreter's own as __wrapped__"
    scalars = [tl.int1, tl.int8, tl.uint8, tl.int16, tl.int32, tl.uint32, tl.int64, tl.float16, tl.bfloat16,
               tl.float32, tl.float64]
    types = [*scalars, *(tl.block_type(t, [4, 8]) for t in scalars), *(tl.block_type(t, [16]) for t in scalars),
             tl.pointer_type(tl.float32), tl.block_type(tl.pointer_type(tl.bfloat16), [8])]
    for _ in range(2):  # asked and then answered from the table
        assert [looked_up(t) for t in types] == [computed(t) for t in types]


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
