"""What the Gluon kernels' tests share: compiling a kernel for sm_90 in a fresh process (the CPU
tests: Gluon has no interpreter), whether a device runs them, and a record of their launches (the GPU
tests)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

from typing import Optional

import pytest
import torch

#: Run in a process of its own: the CPU tests' interpreter (TRITON_INTERPRET=1) leaves Triton's
#: language patched in a worker once it has run a kernel, and Gluon's compiler then fails on it.
_COMPILE = """
import importlib, json
compiled = importlib.import_module({module!r}).compile_for_hopper(**{kwargs!r})
setmaxnreg = [line.split()[0].split(".")[1] + " " + line.split()[1].rstrip(";")
              for line in compiled.asm["ptx"].splitlines() if line.strip().startswith("setmaxnreg")]
print(json.dumps(dict(shared=compiled.metadata.shared, setmaxnreg=setmaxnreg)))
"""


def _in_fresh_process(code: str, cache: pathlib.Path) -> str:
    """``code`` run by a fresh Python with the Triton cache ``cache`` (so that a cached build cannot
    stand in for the compile), the library's ``src`` first on its path and no interpreter; its
    standard output. Fails with the last of its standard error where it fails."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(cache), PYTHONPATH=os.pathsep.join(
        p for p in (str(pathlib.Path(__file__).resolve().parents[2] / "src"), env.get("PYTHONPATH", "")) if p))
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def compile_for_hopper(module: str, cache: pathlib.Path, **kwargs) -> dict:
    """``module.compile_for_hopper(**kwargs)`` in a fresh process (:func:`_in_fresh_process`): its
    shared memory in bytes (``shared``) and its partitions' register moves (``setmaxnreg``: e.g.
    ``"inc 240"``). Fails with the compiler's error."""
    out = _in_fresh_process(_COMPILE.format(module=module, kwargs=kwargs), cache)
    return json.loads(out.strip().splitlines()[-1])


#: The same compile, its cubin disassembled by the ``cuobjdump`` that ships with Triton's NVIDIA
#: backend (an empty string where it does not).
_SASS = """
import importlib, os, subprocess, sys, tempfile, triton
compiled = importlib.import_module({module!r}).compile_for_hopper(**{kwargs!r})
tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
if not os.path.exists(tool):
    sys.exit(0)
with tempfile.TemporaryDirectory() as tmp:
    cubin = os.path.join(tmp, "kernel.cubin")
    with open(cubin, "wb") as f:
        f.write(compiled.asm["cubin"])
    sys.stdout.write(subprocess.run([tool, "-sass", cubin], capture_output=True, text=True, check=True).stdout)
"""


def hopper_sass(module: str, cache: pathlib.Path, **kwargs) -> str:
    """The SASS of ``module.compile_for_hopper(**kwargs)`` (as :func:`compile_for_hopper` builds it),
    one instruction a line; skips the calling test where Triton has no Gluon or no ``cuobjdump``."""
    pytest.importorskip("triton.experimental.gluon")
    sass = _in_fresh_process(_SASS.format(module=module, kwargs=kwargs), cache)
    if not sass.strip():
        pytest.skip("Triton's NVIDIA backend ships no cuobjdump here")
    return sass


def assert_compiles_for_hopper(module: str, cache: pathlib.Path, computing: int = 240, copying: int = 24,
                               **kwargs) -> None:
    """The Gluon kernels' CPU test (skipped where Triton has no Gluon): :func:`compile_for_hopper`
    builds ``module``'s kernel, which fits Hopper's 227 KiB of shared memory a block and whose
    partitions take the registers its launch gives them (``computing`` for each computing warpgroup,
    ``copying`` for the copy warp)."""
    pytest.importorskip("triton.experimental.gluon")
    out = compile_for_hopper(module, cache, **kwargs)
    assert 0 < out["shared"] <= 227 * 1024
    assert {f"inc {computing}", f"dec {copying}"} <= set(out["setmaxnreg"])


def hopper_with_gluon(device) -> bool:
    """Whether ``device`` is a Hopper GPU (compute capability 9) and Triton has Gluon."""
    from nsa.ops._gluon import on_hopper

    return torch.device(device).type == "cuda" and on_hopper(torch.empty(0, device=device))


def skip_without_hopper(device, kernel: str) -> None:
    """Skip the calling GPU test unless ``device`` is a Hopper GPU with Triton's Gluon, naming
    ``kernel``."""
    if not hopper_with_gluon(device):
        pytest.skip(f"{kernel} runs on Hopper GPUs (compute capability 9) with Triton's Gluon")


def record_launches(monkeypatch, module, name: str) -> list:
    """Wrap the launcher ``module.name`` until the test ends so that each call appends to the returned
    list: a test that compares a Gluon kernel with the Triton one asserts that the Gluon one ran."""
    calls = []
    launch = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *args, **kwargs: calls.append(1) or launch(*args, **kwargs))
    return calls


#: The window kernels' GPU comparisons inside the NSA prefill (forced blocks, gates): lengths that end
#: inside a query tile and a key tile, a batch, 8-64 heads a KV head.
WINDOW_IN_NSA = pytest.mark.parametrize(
    "B, T, HQ, H",
    [(1, 4096, 64, 4), (2, 1500, 16, 1), (1, 2048, 32, 4), (1, 1100, 64, 1)],
    ids=["T4096-G16", "B2-T1500-G16", "T2048-G8", "T1100-G64"],
)

#: ... and of the sliding-window op alone (no forced blocks, no gates): ``q_offset`` (keys before the
#: first query, not a multiple of a program's positions), windows shorter and longer than a tile's band
#: of keys, a batch.
WINDOW_ALONE = pytest.mark.parametrize(
    "B, T, HQ, H, q_offset, window",
    [(1, 2000, 16, 1, 300, 512), (2, 1024, 64, 4, 0, 256), (1, 700, 32, 4, 77, 1000)],
    ids=["T2000-offset300", "B2-T1024-G16-window256", "T700-G8-offset77-window1000"],
)


def window_grads_flag_off_and_on(monkeypatch, device, flag: str, module, launcher: str, B: int, T: int, HQ: int,
                                 H: int, q_offset: int = 0, window: Optional[int] = None,
                                 nsa_window: Optional[int] = None) -> None:
    """The window kernels' GPU comparison: the gradients of the NSA prefill (``window`` None: forced
    blocks, gates; its window ``nsa_window``, the default's where None) or of the sliding-window op
    alone (``window`` given: ``q_offset``, no gates) with ``flag`` off and on, bf16, 128-wide heads,
    fresh random inputs. Asserts that the Gluon launcher ``module.launcher`` ran once and that the output
    and every gradient are finite and equal the Triton kernels' within bf16 rounding. Skips where
    ``device`` is not a Hopper GPU with Gluon."""
    skip_without_hopper(device, module.__name__)
    from nsa import NSAConfig, nsa_attention
    from nsa.ops import sliding_window_attention
    from nsa.testing import assert_close

    bf16 = dict(device=device, dtype=torch.bfloat16)
    calls = record_launches(monkeypatch, module, launcher)
    q = torch.randn(B, T, HQ, 128, **bf16)
    k, v = (torch.randn(B, q_offset + T, H, 128, **bf16) for _ in range(2))
    do = torch.randn(B, T, HQ, 128, **bf16)
    if window is None:
        inputs = [x.requires_grad_() for x in (q, k, v, torch.rand(B, T, HQ, 3, **bf16))]
        config = NSAConfig() if nsa_window is None else NSAConfig(window=nsa_window)
        run = lambda: nsa_attention(*inputs, config, backend="triton")  # noqa: E731
    else:
        inputs = [x.requires_grad_() for x in (q, k, v)]
        run = lambda: sliding_window_attention(*inputs, NSAConfig(window=window), q_offset=q_offset,  # noqa: E731
                                               backend="triton")
    out = {}
    for value in ("0", "1"):
        monkeypatch.setenv(flag, value)
        o = run()
        out[value] = (o.detach(), *torch.autograd.grad(o, inputs, do))
    assert len(calls) == 1
    for name, got, want in zip(("o", "dq", "dk", "dv", "dgates"), out["1"], out["0"]):
        assert torch.isfinite(got).all(), name
        assert_close(f"{name}, {flag}=1 against 0", got, want, 2e-3)
