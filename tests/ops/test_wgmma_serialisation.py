"""No library kernel compiles for Hopper with its wgmma instructions serialised, but the launches
measured faster so (:data:`MEASURED_SERIALISED`).

ptxas serialises every ``wgmma.mma_async`` of a kernel (each product waits for the one before)
when a non-wgmma instruction writes or reads a wgmma's accumulator while the wgmma may be in
flight (C7514, C7515), or when too few registers are left to keep the products in flight (C7512).
It says so only in an info note that Triton does not show, and a kernel edit can bring it about
without changing any result: in session 60's window probe it cost up to half the kernel's speed.
This GPU test compiles the library's Hopper launches in a fresh Triton cache (a prefill forward
and backward where the compressed forward's scoring pass is fused and where it runs apart, decode
steps at batch 1 and 16, eager and captured) and reads every kernel's notes through
``scripts/gpu_ptxas_notes.py``.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

from nsa import flags

pytestmark = [pytest.mark.gpu, pytest.mark.triton, pytest.mark.requires(sm=">=9.0")]

ROOT = pathlib.Path(__file__).resolve().parents[2]
#: the notes that mean serialised wgmma
SERIALISED = ("C7512", "C7514", "C7515")
#: Serialised launches measured faster than every unserialised form tried, by (kernel, warps,
#: registers): the notes each may carry, and the flag setting under which the library launches it.
#: The compressed forward's Triton pass 1 (``PASS2_APART["pass1"]``: 128 rows of 8 warps, 64-token
#: tiles capped at 128 registers, two programs an SM) is 6 % faster at 64k than its best launch
#: without C7512 (session 62; the figures beside ``PASS2_APART``); on Hopper the Gluon pass 1 runs in
#: its place by default. The Gluon dK/dV kernels of the compressed and window branches (launched at
#: 168 registers; 12 warps as Triton counts their partitions: the default warpgroup, the other
#: computing one, the copy warp's) have C7512 and are 1.21x and 1.5x the Triton kernels at 64k
#: (18.0 against 21.9 ms, 6.1 against 9.1-9.5); the compressed one's forms without took 28.2 ms (the
#: gradient products' A operands from shared memory, session 62) and 21.6 (one computing warpgroup a
#: program, session 63; ``nsa.ops.compressed.gluon_dkdv``). An entry whose flag setting holds and
#: that no longer compiles serialised fails the test too, so that the list cannot go stale.
MEASURED_SERIALISED = {
    ("compressed_fwd_kernel", 8, "128"): ({"C7512"}, ("NSA_GLUON_COMPRESSED_PASS1", False)),
    ("compressed_bwd_dkdv_gluon_kernel", 12, "168"): ({"C7512"}, ("NSA_GLUON_COMPRESSED_DKDV", True)),
    ("window_bwd_dkdv_gluon_kernel", 12, "168"): ({"C7512"}, ("NSA_GLUON_WINDOW_DKDV", True)),
}


def _notes_script():
    spec = importlib.util.spec_from_file_location("gpu_ptxas_notes", ROOT / "scripts" / "gpu_ptxas_notes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_library_kernel_has_its_wgmma_serialised(tmp_path):
    paths = [str(ROOT / "src"), str(ROOT / "scripts"), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path), PYTHONPATH=os.pathsep.join(p for p in paths if p))
    # a process of its own, so that Triton reads TRITON_CACHE_DIR from its first import; 20k tokens
    # see more than 1024 compressed tokens, where the scoring pass runs apart
    code = "import gpu_ptxas_notes as g; g._run_library([8192, 20480], [1, 16])"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=900)
    rows = _notes_script().kernel_notes(str(tmp_path))
    assert len(rows) >= 20, [name for name, *_ in rows]
    serialised = {(name, warps, regs): {code for code, _ in notes if code in SERIALISED}
                  for name, warps, regs, _, notes in rows}
    serialised = {launch: codes for launch, codes in serialised.items() if codes}
    unexpected = {launch: codes for launch, codes in serialised.items()
                  if not codes <= MEASURED_SERIALISED.get(launch, (set(), None))[0]}
    assert unexpected == {}
    # the subprocess inherited this environment, so these are the flags it ran under
    launched = {launch for launch, (_, (flag, value)) in MEASURED_SERIALISED.items() if flags.get(flag) == value}
    assert set(serialised) >= launched, "a measured exception no longer compiles serialised"
