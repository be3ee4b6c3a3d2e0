"""Which of the library's kernels does ptxas compile with their wgmma instructions serialised?

Why: ptxas serialises every ``wgmma.mma_async`` of a kernel (each product waits for the one
before) when it finds a non-wgmma instruction writing or reading a wgmma's accumulator registers
while the wgmma may be in flight (notes C7514, C7515), or too few registers to keep the products in
flight (C7512), and says so only as an info note that Triton does not show. Session 60 met it in a probe kernel, where it cost 15-25 %. This script runs the
library's prefill (forward+backward, at lengths where each launch form runs) and decode steps on
the GPU with a fresh Triton cache, then hands every compiled kernel's PTX to the same ptxas again
with ``-v`` and reports, per kernel: the notes, registers, spills.

Usage: ``python scripts/gpu_ptxas_notes.py [--lengths 8192 65536] [--batches 1 16]``. Needs a CUDA
GPU (the launches decide which variants get compiled).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
from typing import List, Tuple


def _run_library(lengths, batches) -> None:
    import torch

    from nsa.bench.timing import measure
    from nsa.bench.workloads import Shape, decode_runner, default_config, prefill_runner

    device = torch.device("cuda")
    config = default_config(device)
    for T in lengths:
        for backward in (False, True):
            measure(prefill_runner("nsa", Shape.default(device, 1, T), config, device, backward=backward,
                                   sets=1, flush_l2=False), rounds=1, warmup=0)
    for B in batches:
        for graph in (False, True):
            measure(decode_runner("nsa", Shape.default(device, B, 65536), config, device, graph=graph, sets=1,
                                  flush_l2=False), rounds=1, warmup=0)
    torch.cuda.synchronize()


def _ptxas() -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


def ptxas_report(ptx: str) -> Tuple[str, str, List[Tuple[str, str]]]:
    """``(registers, spills, notes)`` of the PTX file ``ptx`` compiled again by Triton's ptxas with
    ``-v`` for its own target, ``notes`` the ``(code, text)`` of ptxas's performance notes."""
    with open(ptx) as f:
        target = re.search(r"^\.target\s+(\S+)", f.read(), re.M)
    arch = target.group(1).rstrip(",") if target else "sm_90a"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as out:
        proc = subprocess.run([_ptxas(), f"-arch={arch}", "-v", ptx, "-o", out.name], capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    # "... in the function 'k'" (C7514, C7515) or "... for the function 'k'" (C7512)
    notes = sorted(set(re.findall(r"\((C\d{4})\)[^:]*: ([^\n]*?) (?:in|for) the function", log)))
    regs = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    return regs.group(1) if regs else "?", spills.group(0) if spills else "?", notes


def kernel_notes(cache: str) -> List[Tuple[str, object, str, str, List[Tuple[str, str]]]]:
    """``(name, warps, registers, spills, notes)`` of every kernel's PTX in the Triton cache
    ``cache`` (:func:`ptxas_report`)."""
    rows = []
    for ptx in sorted(glob.glob(os.path.join(cache, "**", "*.ptx"), recursive=True)):
        meta_path = ptx[:-4] + ".json"
        name = os.path.basename(ptx)[:-4]
        warps = "?"
        if os.path.exists(meta_path):
            with open(meta_path) as f:
                meta = json.load(f)
            name, warps = meta.get("name", name), meta.get("num_warps", "?")
        rows.append((name, warps, *ptxas_report(ptx)))
    return rows


def _notes(cache: str) -> None:
    rows = kernel_notes(cache)
    serialised = [r for r in rows if r[4]]
    print(f"{len(rows)} compiled kernels, {len(serialised)} with ptxas performance notes")
    for name, warps, regs, spills, notes in rows:
        mark = "  <-- " + "; ".join(f"{code}: {text}" for code, text in notes) if notes else ""
        print(f"{name} ({warps} warps): {regs} registers, {spills}{mark}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 65536])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--cache", help="an existing Triton cache to read instead of running the library")
    args = parser.parse_args()
    if args.cache:
        _notes(args.cache)
        return
    cache = tempfile.mkdtemp(prefix="triton_cache_")
    env = dict(os.environ, TRITON_CACHE_DIR=cache)
    # the library runs in a child process so that TRITON_CACHE_DIR holds from its first import
    code = (f"import sys; sys.argv = ['x']; import gpu_ptxas_notes as g; "
            f"g._run_library({args.lengths!r}, {args.batches!r})")
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    _notes(cache)


if __name__ == "__main__":
    main()
