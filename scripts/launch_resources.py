"""Shared memory, registers and stack of every Triton kernel an op launches, as sized for one of
the shipped GPUs and compiled for it, on a machine without a GPU.

Why: whether a launch fits a GPU's shared memory a program (227 KiB on an H100, 163 on an A100,
99 on an RTX 4090 or 3090), and how much it spills, depends on the dtype, the head dims, the
``tl.dot`` precision and the tiles each op picks for them and for that GPU. Finding out on a GPU
costs its scarce time, and the consumer GPUs are not at hand at all. So the ops run once under
the CPU interpreter, which records each launch exactly as the op made it, with the launchers
sized for the GPU named by ``--as-gpu`` (:func:`nsa.ops._triton.device.sized_as`), and Triton
then compiles those launches for that GPU's compute capability.

Two steps, because the interpreter and the compiler may be different Tritons (use the GPU
machine's for the compile, 3.6 in this repository's sessions)::

    TRITON_INTERPRET=1 PYTHONPATH=src:scripts python scripts/launch_resources.py record \\
        --dtype bfloat16 --dims 192:128 --as-gpu rtx4090 --T 32768 --dry --out /tmp/launches.json
    PYTHONPATH=/tmp/t36:src:scripts python scripts/launch_resources.py compile /tmp/launches.json \\
        --gpu rtx4090

``record`` runs the ops of ``scripts/gpu_kernels_by_dtype.py`` (forward and backward, random
inputs of ``--T`` tokens) with every ``NSA_*`` flag as set in the environment, and writes one
entry per distinct launch; ``--dry`` records the launches without running them, for lengths the
interpreter would take hours over (some launches depend on the length). ``compile`` prints a
markdown table: kernel, warps, stages, shared memory (flagged where it passes the GPU's limit),
``cuobjdump``'s registers and stack a thread, and the compile time (from an empty Triton cache).
With ``--fallback``, a selected kernel's launch past the GPU's shared memory is followed by the
smaller launches the library makes of it then (fewer stages, then key tiles:
:func:`nsa.ops.selected.kernel.smaller_launch`), up to the first that fits.
Session 26 sized the float32 tensor-core launches with it (``docs/perf/float32.md``), session 27
the launches of the A100 and the consumer GPUs (``docs/perf/other_gpus.md``).

A third step tells whether a change to the kernels' source changed what they compile to: record and
compile the same launches from both trees (``--tmp`` folders A and B), then ::

    python scripts/launch_resources.py same A B

prints, for each launch, whether its Triton GPU IR is the same once source locations are left out
(and its SASS, which can differ by register numbers alone where only line numbers moved). Session
80 checked with it that the selected kernels' key tiles left every tuned launch as it was.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import sys
import time
from typing import Any, Dict, List

from nsa.ops._triton.device import SHIPPED_GPUS

_TORCH_TO_TRITON = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64", "int32": "i32",
                    "int64": "i64", "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "i1"}


def _describe(value: Any, is_constexpr: bool) -> str:
    """How the launcher would type one argument, in ``scripts/sass_loops.py``'s notation: a pointer
    (``*bf16``), a tensor descriptor, a scalar (``i32/16`` where Triton specialises a multiple of
    16) or a constexpr."""
    import torch

    if is_constexpr or value is None:
        return str(value)
    if isinstance(value, torch.Tensor):
        return "*" + _TORCH_TO_TRITON[str(value.dtype).replace("torch.", "")]
    if type(value).__name__ == "TensorDescriptor":
        dtype = _TORCH_TO_TRITON[str(value.base.dtype).replace("torch.", "")]
        return f"tensordesc<{dtype}[{','.join(str(b) for b in value.block_shape)}]>"
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        kind = "i64" if abs(value) >= 2 ** 31 else "i32"
        return kind + ("/16" if value % 16 == 0 and value != 0 else "")
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"cannot describe an argument of type {type(value).__name__}")


def record(args: argparse.Namespace) -> None:
    import torch
    from triton.runtime.interpreter import InterpretedFunction

    from gpu_kernels_by_dtype import ops

    from nsa.ops._triton.device import sized_as


    launches: Dict[str, Dict[str, Any]] = {}
    original = InterpretedFunction.run

    def run(self, *call_args, grid, warmup, **kwargs):
        fn = self.fn
        sig = inspect.signature(fn)
        bound = sig.bind_partial(*call_args, **{k: v for k, v in kwargs.items() if k in sig.parameters})
        bound.apply_defaults()
        values = {}
        for name, param in sig.parameters.items():
            is_constexpr = "constexpr" in str(param.annotation)
            values[name] = _describe(bound.arguments.get(name), is_constexpr)
        options = {k: kwargs[k] for k in ("num_warps", "num_stages", "maxnreg") if k in kwargs}
        entry = {"kernel": f"{fn.__module__}:{fn.__name__}", "values": values, "options": options}
        launches.setdefault(json.dumps(entry, sort_keys=True), entry)
        if args.dry:
            return None
        return original(self, *call_args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = run
    if args.config:
        import gpu_kernels_by_dtype

        from nsa import NSAConfig

        # the ops read the module's CONFIG when they run
        gpu_kernels_by_dtype.CONFIG = NSAConfig(**{key: int(value) for key, value in
                                                   (item.split("=") for item in args.config.split(","))})
    dtype = getattr(torch, args.dtype)
    dk, dv = (int(x) for x in args.dims.split(":"))
    for name, call in ops(dtype, dk, dv, "cpu", T=args.T, random_selection=args.dry):
        if args.ops and name not in args.ops:
            continue
        start = time.perf_counter()
        with sized_as(args.as_gpu) if args.as_gpu else contextlib.nullcontext():
            call()
        print(f"recorded {name} ({time.perf_counter() - start:.1f} s): {len(launches)} distinct launches so far",
              file=sys.stderr, flush=True)
    with open(args.out, "w") as f:
        json.dump(list(launches.values()), f, indent=1)


def compile_all(args: argparse.Namespace) -> None:
    import os
    import tempfile

    # an empty cache, so that the compile times are compiles (set before Triton reads it)
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="sm90_resources_cache_")

    import triton

    from sass_loops import compile_kernel, resource_usage

    with open(args.launches) as f:
        launches: List[Dict[str, Any]] = json.load(f)
    gpu = SHIPPED_GPUS[args.gpu]
    cap = gpu.capability[0] * 10 + gpu.capability[1]
    limit = gpu.shared_memory
    print(f"triton {triton.__version__}, sm_{cap} ({args.gpu})\n")
    print(f"| kernel | warps | stages | shared KB | fits {limit // 1024} KB | registers / stack (B) | compile and SASS dump s |")
    print("|---|---:|---:|---:|---|---|---:|")
    for i, entry in enumerate(launches):
        name = entry["kernel"].split(":")[1]
        opts = {"num_warps": 4, "num_stages": 3, "maxnreg": 0, **entry["options"]}
        values, out, label = entry["values"], f"{args.tmp}/k{i}", name
        for smaller in range(64):
            start = time.perf_counter()
            try:
                shared = compile_kernel(entry["kernel"], out, values, opts["num_warps"], opts["num_stages"],
                                        opts["maxnreg"], capability=cap)
            except Exception as err:  # noqa: BLE001 - a launch that does not compile is a finding
                print(f"| {label} | {opts['num_warps']} | {opts['num_stages']} | | | failed: {str(err)[:80]} | |")
                break
            seconds = time.perf_counter() - start
            fits = "yes" if shared <= limit else "**no**"
            print(f"| {label} | {opts['num_warps']} | {opts['num_stages']} | {shared / 1024:.1f} | {fits} | "
                  f"{resource_usage(out + '.cubin')} | {seconds:.1f} |", flush=True)
            if shared <= limit or not args.fallback:
                break
            nxt = _smaller(values, opts)
            if nxt is None:
                print(f"| &#8627; {name}: nothing smaller | | | | **no** | | |")
                break
            values, opts = nxt
            out, label = f"{args.tmp}/k{i}_{smaller + 1}", f"&#8627; {name}, KEY_TILES={values['KEY_TILES']}"


def _smaller(values: Dict[str, str], opts: Dict[str, Any]):
    """The next launch that the library makes of a selected kernel that shared memory does not hold
    (:func:`nsa.ops.selected.kernel.smaller_launch`), as ``(values, options)``; None for any other
    kernel, or where there is none."""
    if "KEY_TILES" not in values:
        return None
    from nsa.ops.selected.kernel import smaller_launch

    launch = {"num_stages": opts["num_stages"], "BSP": int(values["BSP"]), "KEY_TILES": int(values["KEY_TILES"])}
    if values.get("KV_DESC") == "True":
        launch.update(KV_DESC=True, d_k=values.get("d_k"), d_v=values.get("d_v"))
    nxt = smaller_launch(launch)
    if nxt is None:
        return None
    values = dict(values, KEY_TILES=str(nxt["KEY_TILES"]))
    if launch.get("KV_DESC") and "d_k" not in nxt:  # bulk copies off: the descriptors are not passed
        values.update(KV_DESC="False", **{name: "None" for name in ("d_k", "d_v") if name in values})
    return values, dict(opts, num_stages=nxt["num_stages"])


def _without_locations(text: str) -> str:
    """MLIR text with its source locations (``loc(...)``, ``#locN = ...``) left out."""
    import re

    nested = r"\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\)"
    text = re.sub(r"\s*loc" + nested, "", text)
    return "\n".join(line for line in text.splitlines() if line.strip() and not line.startswith("#loc"))


def same(args: argparse.Namespace) -> int:
    """Compare the compiles of two ``compile --tmp`` folders launch by launch; 1 if any IR differs."""
    import pathlib

    first, second = pathlib.Path(args.first), pathlib.Path(args.second)
    names = sorted((p.stem for p in first.glob("k*.ttgir")),
                   key=lambda stem: tuple(int(n) for n in stem[1:].split("_")))
    if not names:
        raise SystemExit(f"no compiled launches (k*.ttgir) in {first}")
    print("| launch | kernel | Triton GPU IR | SASS |\n|---|---|---|---|")
    differs = 0
    for stem in names:
        a, b = first / f"{stem}.ttgir", second / f"{stem}.ttgir"
        if not b.exists():
            print(f"| {stem} | | only in {first} | |")
            differs += 1
            continue
        text = a.read_text()
        kernel = next((line.split("@")[1].split("(")[0] for line in text.splitlines() if "tt.func" in line), "?")
        ir_same = _without_locations(text) == _without_locations(b.read_text())
        sass = [first / f"{stem}.sass", second / f"{stem}.sass"]
        sass_same = (sass[0].read_text() == sass[1].read_text()) if all(x.exists() for x in sass) else None
        differs += not ir_same
        print(f"| {stem} | {kernel} | {'same' if ir_same else '**differs**'} | "
              f"{'-' if sass_same is None else 'same' if sass_same else 'differs'} |")
    return 1 if differs else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    rec = sub.add_parser("record", help="run the ops under the interpreter and record their launches")
    rec.add_argument("--dtype", default="float32")
    rec.add_argument("--dims", default="128:128", help="Dk:Dv")
    rec.add_argument("--ops", nargs="+", default=None, help="only these ops (names of gpu_kernels_by_dtype)")
    rec.add_argument("--out", required=True)
    rec.add_argument("--as-gpu", choices=sorted(SHIPPED_GPUS), default=None,
                     help="size the launches as on this GPU (default: as the interpreter, Hopper-sized)")
    rec.add_argument("--T", type=int, default=300, help="tokens of the inputs")
    rec.add_argument("--config", default="", metavar="FIELD=N,...",
                     help="the NSAConfig of the ops (default sel_count=4), e.g. sel_block=128,cmp_block=48")
    rec.add_argument("--dry", action="store_true",
                     help="record the launches without running them (outputs are garbage; for long --T)")
    com = sub.add_parser("compile", help="compile recorded launches for sm_90")
    com.add_argument("launches")
    com.add_argument("--tmp", default="/tmp", help="folder for the cubins")
    com.add_argument("--gpu", default="h100", choices=sorted(SHIPPED_GPUS),
                     help="compile for this GPU's compute capability, flag launches past its shared memory")
    com.add_argument("--fallback", action="store_true",
                     help="where a selected kernel's launch is past shared memory, also compile the smaller "
                          "launches that the library falls back to (smaller_launch), until one fits")
    cmp = sub.add_parser("same", help="whether two compile folders' launches compile to the same IR")
    cmp.add_argument("first")
    cmp.add_argument("second")
    args = parser.parse_args()
    if args.step == "same":
        sys.exit(same(args))
    record(args) if args.step == "record" else compile_all(args)


if __name__ == "__main__":
    main()
