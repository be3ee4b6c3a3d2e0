"""Which Triton kernels each op compiles for float32 against bfloat16 inputs, how long the
compiles take, and what they compiled to (registers, spills, shared memory).

Why: on the GPU the test suite's float32 cases took minutes a test (session 25: a Dk = 192
compressed forward+backward 171 s), and the sm_90 compile of the compressed dK/dV kernel at
float32, head dim 128, read off locally (``scripts/sass_loops.py``) held a 29 KB stack a thread.

For each dtype and head dims, each op runs forward and backward on random inputs (B = 1, T = 300
unless ``--T``, 16 query heads, 1 KV head, paper defaults but sel_count 4; the decode: one step of
a batch of 2): the first call (compiles included) and the second are timed, and every kernel of the
``nsa.ops`` modules compiled so far is listed once. float32 runs at the precision
``NSA_FLOAT32_DOT`` (or torch's float32 matmul precision) gives, printed in the header. Output as
markdown; run from an empty ``TRITON_CACHE_DIR`` for compile times.

``--tuned-tiles`` runs the prefill kernels' exact float32 launches at the tiles tuned for 16-bit
inputs, as before session 30 (:data:`nsa.ops._triton.attention.EXACT_FLOAT32_TILES` not taken; the
decode keeps its own), to compare compile and call times with the float32 tiles.

Usage: ``python scripts/gpu_kernels_by_dtype.py [--dtypes float32 bfloat16] [--dims 128:128 192:128]
[--ops nsa_attention ...] [--T 4096] [--repeat 5] [--tuned-tiles]``.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time
from typing import Callable, Dict, List, Set, Tuple

import torch
import triton

from compiled_kernels import resources  # scripts/ is on the path as the session scripts run it
from nsa import NSAConfig, nsa_attention
from nsa.ops import compressed_attention, mean_compress, selected_attention, select_blocks, sliding_window_attention
from nsa.ops._triton.attention import dot_precision
from nsa.ops.decode import nsa_decode

CONFIG = NSAConfig(sel_count=4)
MODULES = ["nsa.ops.compressed.kernel", "nsa.ops._triton.compressed_fwd", "nsa.ops._triton.block_topn",
           "nsa.ops.selected.kernel", "nsa.ops.selected.inversion", "nsa.ops.window.kernel", "nsa.ops.gates.kernel",
           "nsa.ops.compress.kernel", "nsa.ops.decode.compressed_pass", "nsa.ops.decode.score", "nsa.ops.decode.selected",
           "nsa.ops.decode.combine"]


def compiled_kernels() -> Dict[Tuple[str, int], str]:
    """Every compiled variant of every Triton kernel of :data:`MODULES`: ``{(name, index): resources}``."""
    out = {}
    for mod_name in MODULES:
        for name, fn in vars(importlib.import_module(mod_name)).items():
            if isinstance(fn, triton.runtime.jit.JITFunction):
                out.update(((name, i), res) for i, res in enumerate(resources(fn)))
    return out


def ops(dtype: torch.dtype, dk: int, dv: int, dev: str = "cuda", T: int = 300,
        random_selection: bool = False) -> List[Tuple[str, Callable[[], None]]]:
    """``(name, forward+backward)`` of each op on fresh inputs of ``T`` tokens (the decode step:
    forward). ``random_selection`` gives ``selected_attention`` random blocks instead of the
    selection's (for callers that launch no kernel, whose selection would be garbage)."""
    B, HQ, H = 1, 16, 1
    q = torch.randn(B, T, HQ, dk, device=dev, dtype=dtype, requires_grad=True)
    k = torch.randn(B, T, H, dk, device=dev, dtype=dtype, requires_grad=True)
    v = torch.randn(B, T, H, dv, device=dev, dtype=dtype, requires_grad=True)
    gates = torch.rand(B, T, HQ, 3, device=dev, dtype=dtype, requires_grad=True)
    k_cmp, v_cmp = (mean_compress(x.detach(), CONFIG).requires_grad_() for x in (k, v))
    if random_selection:
        visible = torch.arange(T, device=dev) // CONFIG.sel_block + 1  # blocks each query sees
        draws = torch.rand(B, T, H, CONFIG.sel_count, device=dev)
        block_idx = (draws * visible[None, :, None, None]).long().to(torch.int32)
    else:
        block_idx = select_blocks(q.detach(), k_cmp.detach(), CONFIG, backend="triton")

    def backward(*outs):
        torch.autograd.backward([o for o in outs if o.requires_grad],
                                [torch.randn_like(o) for o in outs if o.requires_grad])

    return [
        ("compressed_attention", lambda: backward(*compressed_attention(q, k_cmp, v_cmp, CONFIG, backend="triton"))),
        ("selected_attention", lambda: backward(selected_attention(q, k, v, block_idx, CONFIG, backend="triton"))),
        ("sliding_window_attention", lambda: backward(sliding_window_attention(q, k, v, CONFIG, backend="triton"))),
        ("nsa_attention", lambda: backward(nsa_attention(q, k, v, gates, CONFIG, backend="triton"))),
        # one decode step of a batch of 2 (caches of T and T - 37 tokens): forward only
        ("nsa_decode", lambda: nsa_decode(
            q.detach()[:, -1:].expand(2, 1, HQ, dk), k.detach().expand(2, T, H, dk), v.detach().expand(2, T, H, dv),
            gates.detach()[:, -1:].expand(2, 1, HQ, 3), torch.tensor([T, T - 37], dtype=torch.int32, device=dev), CONFIG,
            kv_cmp=(k_cmp.detach().expand(2, *k_cmp.shape[1:]), v_cmp.detach().expand(2, *v_cmp.shape[1:])),
            backend="triton")),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--dims", nargs="+", default=["128:128", "192:128"], help="Dk:Dv pairs")
    parser.add_argument("--device", default="cuda", help="cpu: a dry run through the interpreter")
    parser.add_argument("--ops", nargs="+", default=None, help="only these ops (default: all five)")
    parser.add_argument("--T", type=int, default=300, help="tokens (the second call's time is the op's at this length)")
    parser.add_argument("--repeat", type=int, default=1, help="calls after the first; their median is reported")
    parser.add_argument("--tuned-tiles", action="store_true",
                        help="exact float32 prefill launches at the 16-bit inputs' tiles (as before session 30)")
    args = parser.parse_args()
    if args.tuned_tiles:
        for mod_name in ("nsa.ops._triton.compressed_fwd", "nsa.ops.compressed.kernel", "nsa.ops.selected.kernel",
                         "nsa.ops.window.kernel"):
            module = importlib.import_module(mod_name)
            for name, answer in (("exact_float32", False), ("exact_float32_tiles", None)):
                if hasattr(module, name):
                    setattr(module, name, lambda *_, answer=answer: answer)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    tiles = "16-bit inputs' tiles (--tuned-tiles)" if args.tuned_tiles else "the library's"
    print(f"Device: {name}; torch {torch.__version__}, triton {triton.__version__}; T = {args.T}; exact float32 "
          f"prefill tiles: {tiles}\n", flush=True)
    later = "second call ms" if args.repeat == 1 else f"median of {args.repeat} later calls, ms"
    print(f"| dtype | Dk:Dv | products | op | first call s | {later} | kernels compiled by it |", flush=True)
    print("|---|---|---|---|---:|---:|---|", flush=True)
    seen: Set[Tuple[str, int]] = set(compiled_kernels())
    details = []
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        for dims in args.dims:
            dk, dv = (int(x) for x in dims.split(":"))
            products = dot_precision(dtype, torch.device(args.device), max(dk, dv))  # NSA_FLOAT32_DOT, torch's setting
            for op_name, call in ops(dtype, dk, dv, args.device, args.T):
                if args.ops and op_name not in args.ops:
                    continue
                sync()
                start = time.perf_counter()
                try:
                    call()
                    sync()
                    first = f"{time.perf_counter() - start:.1f}"
                    times = []
                    for _ in range(max(1, args.repeat)):
                        start = time.perf_counter()
                        call()
                        sync()
                        times.append(time.perf_counter() - start)
                    second = f"{statistics.median(times) * 1e3:.2f}"
                except Exception as err:  # noqa: BLE001 - a failing op is the finding, the others still run
                    first, second = f"failed after {time.perf_counter() - start:.1f}", f"{type(err).__name__}: {str(err)[:90]}"
                now = compiled_kernels()
                new = {key: res for key, res in now.items() if key not in seen}
                seen.update(new)
                details += [f"- {dtype_name} {dims} {op_name}: {key[0]} ({res})" for key, res in new.items()]
                print(f"| {dtype_name} | {dims} | {products} | {op_name} | {first} | {second} | {len(new)} |", flush=True)
    print("\nKernels compiled, by the op that first needed them:\n")
    print("\n".join(details), flush=True)


if __name__ == "__main__":
    main()
