"""What the Gluon kernels' tests share: compiling a kernel for sm_90 in a fresh process (the CPU
tests: Gluon has no interpreter), whether a device runs them, and a record of their launches (the GPU
tests)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

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


def compile_for_hopper(module: str, cache: pathlib.Path, **kwargs) -> dict:
    """``module.compile_for_hopper(**kwargs)`` in a fresh process with the Triton cache ``cache`` (so
    that a cached build cannot stand in for the compile): its shared memory in bytes (``shared``) and
    its partitions' register moves (``setmaxnreg``: e.g. ``"inc 240"``). Fails with the compiler's
    error."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(cache), PYTHONPATH=os.pathsep.join(
        p for p in (str(pathlib.Path(__file__).resolve().parents[2] / "src"), env.get("PYTHONPATH", "")) if p))
    code = _COMPILE.format(module=module, kwargs=kwargs)
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def hopper_with_gluon(device) -> bool:
    """Whether ``device`` is a Hopper GPU (compute capability 9) and Triton has Gluon."""
    from nsa.ops._gluon import on_hopper

    return torch.device(device).type == "cuda" and on_hopper(torch.empty(0, device=device))


def record_launches(monkeypatch, module, name: str) -> list:
    """Wrap the launcher ``module.name`` until the test ends so that each call appends to the returned
    list: a test that compares a Gluon kernel with the Triton one asserts that the Gluon one ran."""
    calls = []
    launch = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *args, **kwargs: calls.append(1) or launch(*args, **kwargs))
    return calls
