"""Compile one Triton kernel for Hopper (sm_90) on a machine without a GPU and count the SASS
instructions of each loop, by opcode.

Why: the GPU machine's time is scarce, and how many instructions a kernel's inner loop issues
(shuffles, multiplies, address arithmetic) can be read off the compiled code. Triton compiles for
any target without a device; use the GPU machine's Triton (3.6 here) so that the code is the one
that runs there::

    pip install --no-deps --target /tmp/t36 triton==3.6.0
    PYTHONPATH=/tmp/t36:src python scripts/sass_loops.py \\
        nsa.ops._triton.compressed_fwd:compressed_fwd_kernel /tmp/cmp \\
        q=*bf16 k=*bf16 v=*bf16 o=*bf16 lse=*fp32 scores=*fp32 TQ=i32 NC=i32 q_offset=i32 \\
        qk_scale=fp32 T0=i32 T1=i32 NSEL=i32 H=4 G=16 GP=16 BT=4 BN=64 DK=128 DV=128 BDK=128 \\
        BDV=128 L=32 S=16 SEL=64 R=4 RP=4 KC=2 NSPILL=2 NB=32 STORE_O=True SELECT=True \\
        PREC=tf32 num_warps=4 num_stages=3

Every parameter of the kernel is named: ``*dtype`` for a pointer (assumed 16-byte aligned, as
the launcher's tensors are, so that loads can be pipelined), ``i32``/``i64``/``fp32`` for a
runtime scalar (``i64/16``: one that Triton's launcher specialises as a multiple of 16, as it does
the strides of most tensors; without it, loads along such a stride compile as 16-bit scalar loads,
unlike the code that runs), ``tensordesc<bf16[1,64,1,128]>`` for a tensor descriptor built on the
host (its block shape in brackets), anything else for a constexpr (``True``/``False``, ``None``, an
integer or a string).
Writes ``OUT.ttgir``, ``OUT.ptx``, ``OUT.cubin`` and ``OUT.sass``; prints the shared memory and, for each
backward branch (a loop), its instruction count and commonest opcodes. Session 14 used it to
take the compressed forward's scoring step from 616 to 457 instructions (docs/perf/prefill.md).
``--by-line N`` also prints the whole kernel's instruction count and the ``N`` source lines with
the most instructions (``nvdisasm``'s line table: a helper's lines count where they are written,
``triton/language/standard.py`` lines are Triton's reductions and sorts); session 43 read the
decode score and selection programs' instructions with it (docs/perf/decode.md).
"""

from __future__ import annotations

import argparse
import collections
import importlib
import inspect
import os
import re
import subprocess
from typing import Dict, List, Optional, Tuple

SCALARS = ("i32", "i64", "fp32")


def _constexpr(value: str):
    if value in ("True", "False"):
        return value == "True"
    if value == "None":
        return None
    return int(value) if value.lstrip("-").isdigit() else value


def compile_kernel(target: str, out: str, values: Dict[str, str], num_warps: int, num_stages: int,
                   maxnreg: int = 0, capability: int = 90, fp_fusion: Optional[bool] = None) -> int:
    """Compile ``module:kernel`` with the given parameter values for compute ``capability``
    (``maxnreg`` > 0 caps the registers a thread as the launch option of that name does;
    ``fp_fusion`` overrides the library's ``enable_fp_fusion``, as the launches that pass
    ``UNFUSED_LAUNCH_OPTIONS`` do); returns
    its shared memory."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module, name = target.split(":")
    fn = getattr(importlib.import_module(module), name)
    params = list(inspect.signature(fn.fn).parameters)
    missing = [p for p in params if p not in values]
    if missing:
        raise SystemExit(f"name every parameter of {name}; missing: {', '.join(missing)}")
    signature, constexprs, attrs = {}, {}, {}
    for i, p in enumerate(params):
        value = values[p]
        if value.startswith("*"):
            signature[p] = value
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif value.startswith("tensordesc<"):
            signature[p] = value  # a host-built tensor descriptor, e.g. tensordesc<bf16[1,64,1,128]>
        elif value.split("/")[0] in SCALARS:
            # "i64/16": a scalar the launcher specialises as a multiple of 16 (strides usually are)
            signature[p] = value.split("/")[0]
            if value.endswith("/16"):
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[p] = "constexpr"
            constexprs[(i,)] = _constexpr(value)
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    # the options every library launch passes (FMA fusion), so that the compile is the launch's
    from nsa.ops._triton.launch import LAUNCH_OPTIONS

    options = dict(LAUNCH_OPTIONS, num_warps=num_warps, num_stages=num_stages, **({"maxnreg": maxnreg} if maxnreg else {}))
    if fp_fusion is not None:
        options["enable_fp_fusion"] = fp_fusion
    kernel = triton.compile(src, target=GPUTarget("cuda", capability, 32), options=options)
    with open(out + ".ttgir", "w") as f:
        f.write(kernel.asm["ttgir"])
    with open(out + ".ptx", "w") as f:
        f.write(kernel.asm["ptx"])
    with open(out + ".cubin", "wb") as f:
        f.write(kernel.asm["cubin"])
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    sass = subprocess.run([cuobjdump, "-sass", out + ".cubin"], capture_output=True, text=True, check=True).stdout
    with open(out + ".sass", "w") as f:
        f.write(sass)
    return kernel.metadata.shared


def resource_usage(cubin: str) -> str:
    """The ``REG``/``STACK``/``LOCAL`` line of ``cuobjdump -res-usage``: registers a thread, and the
    stack and local memory that spills would show in."""
    cuobjdump = os.path.join(os.path.dirname(__import__("triton").__file__), "backends", "nvidia", "bin", "cuobjdump")
    usage = subprocess.run([cuobjdump, "-res-usage", cubin], capture_output=True, text=True, check=True).stdout
    found = re.search(r"REG:\d+ STACK:\d+ SHARED:\d+ LOCAL:\d+", usage)
    return found.group(0) if found else usage.strip()


def by_line(cubin: str) -> collections.Counter:
    """Instructions of the ``cubin`` by ``(file, line)`` of the source that they compile, from
    ``nvdisasm``'s line-info listing."""
    nvdisasm = os.path.join(os.path.dirname(__import__("triton").__file__), "backends", "nvidia", "bin", "nvdisasm")
    listing = subprocess.run([nvdisasm, "-gi", "-c", cubin], capture_output=True, text=True, check=True).stdout
    counts: collections.Counter = collections.Counter()
    where = None
    for line in listing.splitlines():
        found = re.search(r'//## File "(.*?)", line (\d+)', line)
        if found:
            where = (found.group(1), int(found.group(2)))
        elif where and re.match(r"\s*/\*[0-9a-f]{4,}\*/", line):
            counts[where] += 1
    return counts


def source_line(path: str, line: int) -> str:
    try:
        with open(path) as f:
            return f.read().splitlines()[line - 1].strip()
    except (OSError, IndexError):
        return ""


def loops(sass: str) -> List[Tuple[int, int, collections.Counter]]:
    """``(start, end, opcode counts)`` of every backward branch's body in a SASS listing."""
    code = [(int(m.group(1), 16), m.group(2).strip())
            for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    found = []
    for address, text in code:
        target = re.search(r"BRA\s.*?0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) < address:
            start = int(target.group(1), 16)
            body = [t for a, t in code if start <= a <= address]
            ops = collections.Counter((t.split()[1] if t.startswith("@") else t.split()[0]).split(".")[0] for t in body)
            found.append((start, address, ops))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernel", help="module:kernel, e.g. nsa.ops.compressed.kernel:compressed_bwd_dq_kernel")
    parser.add_argument("out", help="path prefix of the .ttgir, .ptx, .cubin and .sass files")
    parser.add_argument("values", nargs="+", help="NAME=VALUE for every parameter, and num_warps=, num_stages=, maxnreg=, "
                        "enable_fp_fusion= (optional)")
    parser.add_argument("--by-line", type=int, default=0, metavar="N",
                        help="also the kernel's instruction count and its N source lines with the most instructions")
    args = parser.parse_args()
    values = dict(v.split("=", 1) for v in args.values)
    num_warps, num_stages = int(values.pop("num_warps", 4)), int(values.pop("num_stages", 3))
    maxnreg = int(values.pop("maxnreg", 0))
    fusion = values.pop("enable_fp_fusion", None)
    shared = compile_kernel(args.kernel, args.out, values, num_warps, num_stages, maxnreg,
                            fp_fusion=None if fusion is None else fusion == "True")
    print(f"shared memory {shared} B; {resource_usage(args.out + '.cubin')}")
    with open(args.out + ".sass") as f:
        for start, end, ops in loops(f.read()):
            print(f"loop {start:#x}-{end:#x}: {sum(ops.values())} instructions; "
                  + ", ".join(f"{op} {n}" for op, n in ops.most_common(12)))
    if args.by_line:
        counts = by_line(args.out + ".cubin")
        print(f"{sum(counts.values())} instructions; by source line:")
        for (path, line), n in counts.most_common(args.by_line):
            print(f"{n:6d}  {os.path.basename(path)}:{line}  {source_line(path, line)[:100]}")


if __name__ == "__main__":
    main()
