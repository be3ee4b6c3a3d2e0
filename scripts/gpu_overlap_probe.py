"""Do NSA's branches overlap on the SMs when launched on separate CUDA streams?

Usage: ``python scripts/gpu_overlap_probe.py [--lengths 8192 65536] [--only occupancy backward forward]``

The selected kernels are bound by L2 throughput (86 % of it, 30 % of the SMs), the compressed
kernels by tensor-core work and their own latency: if their programs shared SMs, each could
hide in the other's stalls. A kernel of many waves normally keeps the SMs to itself (the block
scheduler serves its pending programs first), but the selected kernels' programs are small
(one or two warps), so they may fill what the compressed kernels' large programs leave free.

1. **occupancy**: registers, shared memory and warps of every compiled kernel of one training step.
2. **backward**: the three branch backwards one after another (as training runs them) against
   the compressed one on a stream of its own beside the selected and window ones (their ``dq``
   added afterwards), in both launch orders and stream priorities; each alone for reference.
3. **forward**: compressed-with-selection then selected, whole or by query chunks, against the
   chunks pipelined over two streams (chunk ``c``'s selected attention beside chunk ``c + 1``'s
   compressed attention), and the window branch on a third stream.

Outputs of every variant are compared bitwise with the sequential one's (a race would show).
"""

from __future__ import annotations

import argparse
from types import SimpleNamespace
from typing import Callable, Dict, List, Tuple

import torch
import triton
from triton.testing import do_bench

from compiled_kernels import resources
from nsa import NSAConfig
from nsa.bench.workloads import Shape, prefill_inputs
from nsa.ops import mean_compress
from nsa.ops._triton.compressed_fwd import compressed_fwd
from nsa.ops.compressed.kernel import compressed_bwd
from nsa.ops.gates.kernel import gates_bwd, gates_fwd
from nsa.ops.selected.kernel import selected_bwd, selected_fwd
from nsa.ops.window.kernel import window_bwd, window_fwd, window_fwd_summed

DEV = torch.device("cuda")
D = 128


def bench(fn: Callable[[], object]) -> float:
    return do_bench(fn, warmup=25, rep=500, return_mode="median")


def case(T: int, config: NSAConfig, seed: int) -> SimpleNamespace:
    """Inputs and saved forward tensors of one training step at length ``T``."""
    torch.manual_seed(seed)
    q, k, v, gates, do = prefill_inputs("nsa", Shape.default(DEV, 1, T), DEV, True)
    q, k, v, gates = (x.detach() for x in (q, k, v, gates))
    k_cmp, v_cmp = mean_compress(k, config), mean_compress(v, config)
    scale, forced = config.softmax_scale(D), (config.init_blocks, config.local_blocks)
    o_cmp, lse_cmp, idx = compressed_fwd(q, k_cmp, v_cmp, config, scale, 0, select=True)
    o_slc, lse_slc = selected_fwd(q, k, v, idx, config.sel_block, scale, 0, forced=forced)
    o_win, lse_win = window_fwd(q, k, v, config.window, scale, 0)
    delta = gates_bwd(gates, o_cmp, o_slc, o_win, do, with_delta=True, store_do=False)[4]
    gate = gates.float().permute(3, 0, 1, 2).contiguous()
    return SimpleNamespace(**locals())


def same(a: Tuple[torch.Tensor, ...], b: Tuple[torch.Tensor, ...]) -> str:
    return "bitwise equal" if all(torch.equal(x, y) for x, y in zip(a, b)) else "DIFFERENT"


def occupancy() -> None:
    """Registers, spills, shared memory and warps of every kernel compiled so far."""
    import nsa.ops._triton.compressed_fwd as cf
    import nsa.ops._triton.block_topn as bt
    import nsa.ops.compressed.kernel as ck
    import nsa.ops.gates.kernel as gk
    import nsa.ops.selected.kernel as sk
    import nsa.ops.window.kernel as wk

    for module in (cf, bt, ck, gk, sk, wk):
        for name in dir(module):
            for line in resources(getattr(module, name)):
                print(f"occupancy {name}: {line}", flush=True)


def backward(T: int, config: NSAConfig) -> None:
    c = case(T, config, T + 5)
    sel_block, window, scale = config.sel_block, config.window, c.scale

    def cmp_bwd():
        return compressed_bwd(c.q, c.k_cmp, c.v_cmp, c.o_cmp, c.lse_cmp, c.do, None, config, scale, 0,
                              delta=c.delta[0], gate=c.gate[0])

    def sel_bwd(dq=None):
        return selected_bwd(c.q, c.k, c.v, c.idx, c.o_slc, c.lse_slc, c.do, sel_block, scale, 0, forced=c.forced,
                            delta=c.delta[1], dq=dq, gate=c.gate[1])

    def win_bwd(dq=None):
        return window_bwd(c.q, c.k, c.v, c.o_win, c.lse_win, c.do, window, scale, 0, delta=c.delta[2], dq=dq,
                          gate=c.gate[2])

    def sequential():
        dq, dkc, dvc = cmp_bwd()
        _, dks, dvs = sel_bwd(dq)
        _, dkw, dvw = win_bwd(dq)
        return dq, dkc, dvc, dks, dvs, dkw, dvw

    def sequential_own_dq():  # the parallel variants' arithmetic, on one stream
        dq, dkc, dvc = cmp_bwd()
        dq2, dks, dvs = sel_bwd()
        _, dkw, dvw = win_bwd(dq2)
        return dq.add_(dq2), dkc, dvc, dks, dvs, dkw, dvw

    def parallel(cmp_first: bool, cmp_priority: int, sel_priority: int):
        s_cmp = torch.cuda.Stream(priority=cmp_priority)
        s_sel = torch.cuda.Stream(priority=sel_priority)

        def run():
            main = torch.cuda.current_stream()
            s_cmp.wait_stream(main)
            s_sel.wait_stream(main)
            out = {}

            def on_cmp():
                with torch.cuda.stream(s_cmp):
                    out["cmp"] = cmp_bwd()

            def on_sel():
                with torch.cuda.stream(s_sel):
                    dq2, dks, dvs = sel_bwd()
                    _, dkw, dvw = win_bwd(dq2)
                    out["sel"] = dq2, dks, dvs, dkw, dvw

            for launch in ((on_cmp, on_sel) if cmp_first else (on_sel, on_cmp)):
                launch()
            main.wait_stream(s_cmp)
            main.wait_stream(s_sel)
            dq, dkc, dvc = out["cmp"]
            dq2, dks, dvs, dkw, dvw = out["sel"]
            return dq.add_(dq2), dkc, dvc, dks, dvs, dkw, dvw

        return run

    alone = {"compressed": cmp_bwd, "selected": sel_bwd, "window": win_bwd}
    times = {name: bench(fn) for name, fn in alone.items()}
    print(f"T={T} backward alone: " + ", ".join(f"{n} {t:.3f} ms" for n, t in times.items())
          + f" (sum {sum(times.values()):.3f})", flush=True)
    ref = sequential_own_dq()
    variants: Dict[str, Callable[[], tuple]] = {
        "sequential (training's order, dq shared)": sequential,
        "sequential, own dq then one add": sequential_own_dq,
        "2 streams, compressed launched first": parallel(True, 0, 0),
        "2 streams, selected launched first": parallel(False, 0, 0),
        "2 streams, compressed first, compressed high priority": parallel(True, -1, 0),
        "2 streams, compressed first, selected high priority": parallel(True, 0, -1),
    }
    for label, fn in variants.items():
        out = fn()
        torch.cuda.synchronize()
        print(f"T={T} backward {label}: {bench(fn):.3f} ms ({same(out[1:], ref[1:])} beyond dq, "
              f"dq {same(out[:1], ref[:1])} to own-dq order)", flush=True)
    print(f"T={T} backward sequential again: {bench(sequential):.3f} ms", flush=True)


def forward(T: int, config: NSAConfig, chunk_counts: List[int]) -> None:
    c = case(T, config, T + 9)
    scale, sel_block, window = c.scale, config.sel_block, config.window
    q, k, v = c.q, c.k, c.v

    def whole():
        o_cmp, lse_cmp, idx = compressed_fwd(q, c.k_cmp, c.v_cmp, config, scale, 0, select=True)
        o_slc, lse_slc = selected_fwd(q, k, v, idx, sel_block, scale, 0, forced=c.forced)
        return o_cmp, o_slc, idx

    def chunked(n: int, streams: bool):
        bounds = [(T * i // n // 64 * 64, T * (i + 1) // n // 64 * 64 if i + 1 < n else T) for i in range(n)]
        s_cmp, s_sel = torch.cuda.Stream(), torch.cuda.Stream()

        def run():
            main = torch.cuda.current_stream()
            outs = []
            if streams:
                s_cmp.wait_stream(main)
                s_sel.wait_stream(main)
            for t0, t1 in bounds:
                qc = q[:, t0:t1]
                with torch.cuda.stream(s_cmp if streams else main):
                    o_cmp, _, idx = compressed_fwd(qc, c.k_cmp, c.v_cmp, config, scale, t0, select=True)
                if streams:
                    s_sel.wait_stream(s_cmp)
                with torch.cuda.stream(s_sel if streams else main):
                    o_slc, _ = selected_fwd(qc, k, v, idx, sel_block, scale, t0, forced=c.forced)
                outs.append((o_cmp, o_slc, idx))
            if streams:
                main.wait_stream(s_cmp)
                main.wait_stream(s_sel)
            return tuple(torch.cat(parts, 1) for parts in zip(*outs))

        return run

    def with_window(inner: Callable[[], tuple]):
        s_win = torch.cuda.Stream()

        def run():
            main = torch.cuda.current_stream()
            s_win.wait_stream(main)
            with torch.cuda.stream(s_win):
                o_win, _ = window_fwd(q, k, v, window, scale, 0)
            o_cmp, o_slc, idx = inner()
            main.wait_stream(s_win)
            return gates_fwd(c.gates, o_cmp, o_slc, o_win), idx

        return run

    def training_forward():
        o_cmp, o_slc, idx = whole()
        return window_fwd_summed(q, k, v, window, scale, 0, c.gates, o_cmp, o_slc)[0], idx

    ref = whole()
    for label, fn in [("compressed+selected, whole", whole)] + [
        (f"compressed+selected, {n} chunks, {'2 streams' if s else 'one stream'}", chunked(n, s))
        for n in chunk_counts for s in (False, True)
    ]:
        out = fn()
        torch.cuda.synchronize()
        print(f"T={T} forward {label}: {bench(fn):.3f} ms ({same(out, ref)})", flush=True)
    ref_o = training_forward()
    n = chunk_counts[-1]
    for label, fn in (("training forward (window writes the sum)", training_forward),
                      ("window on its own stream beside whole, then gates kernel", with_window(whole)),
                      (f"window on its own stream beside {n} pipelined chunks, then gates kernel",
                       with_window(chunked(n, True)))):
        out = fn()
        torch.cuda.synchronize()
        print(f"T={T} forward {label}: {bench(fn):.3f} ms ({same(out, ref_o)})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 65536])
    parser.add_argument("--only", nargs="+", default=["backward", "forward", "occupancy"])
    args = parser.parse_args()
    config = NSAConfig()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    for T in args.lengths:
        if "backward" in args.only:
            backward(T, config)
        if "forward" in args.only:
            forward(T, config, [2, 4] if T <= 16384 else [4, 8])
        torch.cuda.empty_cache()
    if "occupancy" in args.only:
        occupancy()


if __name__ == "__main__":
    main()
