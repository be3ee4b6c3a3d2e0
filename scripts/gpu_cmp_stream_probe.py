"""What holds the batch-16 compressed pass below dense decode's read rate? Probe kernels over its bytes.

At batch 16, 64k (bf16, HQ 64, H 4, D 128, paper defaults) launch 1 of a decode step reads the
compressed keys and values, 134 MB, in one wave of 3 programs an SM (6 splits of each (row, KV
group), 32-token tiles through tensor descriptors, 3 pipeline stages): about 39 us eager, 3.4
TB/s, where dense decode reads its whole cache at 4.4. This script runs probe kernels with the
same grid, tiles and copies, each doing a little more of the pass's work per tile:

- ``stream``: the tiles added up elementwise (nothing but the copies and one add);
- ``dots``: the group's scores and values product, ``acc += (q k^T) v``, no softmax;
- ``softmax``: the online softmax of the library (``nsa.ops.decode.tiles.online_softmax_step``);
- ``masses``: that, and each tile's block masses stored as the library's pass stores them
  (``nsa.ops.decode.sink.store_scores``);
- ``stream_rows``: ``stream`` with one program a (split, row) over every KV head, the cache seen
  as ``[B, T*H, 1, D]``: each tile is whole 1-KiB token rows, contiguous, where the library's
  tiles are one head's 256 bytes of each token, 1 KiB apart.

Then the library's decode kernels themselves (eager, PDL off, from the profiler) and a copy of
the same bytes by PyTorch. ``stream`` and ``stream_rows`` are checked against PyTorch's sums of
the tiles and ``softmax`` against each split's softmax partials (``dots`` and ``masses``, whose
outputs only keep the work alive, show "-"). Times are means of 50 back-to-back launches after a
warm-up (134 MB is over twice the L2, so each launch reads from memory), every probe once a
round, in several rounds; in us, with the rate of the 134 MB read, and the probe kernel's own time
from the profiler (as the library's kernels are given). The probes hold fewer registers and less
shared memory than the library's kernel, so an SM may take more of them than its 3 (the table
gives how many).

Usage: ``python scripts/gpu_cmp_stream_probe.py [--batch 16] [--context 65536] [--rounds 5]``; prints markdown.
"""

from __future__ import annotations

import argparse
from typing import Callable, List, Tuple

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from nsa.ops.decode.sink import store_scores
from nsa.ops.decode.tiles import online_softmax_step

H, G, D = 4, 16, 128
LOG2E = 1.4426950408889634
MODES = {"stream": 0, "dots": 1, "softmax": 2, "masses": 3, "stream_rows": 4}


@triton.jit
def probe_kernel(q, d_k, d_v, out, m_out, l_out, sink, T, qk_scale, SPLITS, SINK_STRIDE,  #
                 H: tl.constexpr, G: tl.constexpr, D: tl.constexpr, BC: tl.constexpr, MODE: tl.constexpr):
    """One (split, row, KV head) program over whole ``BC``-token tiles of a ``[B, T, H, D]``
    cache; ``out [SPLITS, B*H*G, D]`` (``m_out``/``l_out [SPLITS, B*H*G]`` with the softmax)."""
    i_s, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    if MODE == 4:  # (split, row) programs over the cache seen as [B, T*H, 1, D]: every KV head
        i_b, i_h = i_bh, 0
    chunk = tl.cdiv(tl.cdiv(T, SPLITS), BC) * BC
    lo = i_s * chunk
    hi = tl.minimum(lo + chunk, T)
    o_g, o_d = tl.arange(0, G), tl.arange(0, D)
    rows = (i_bh * G + o_g).to(tl.int64)
    b_q = tl.load(q + rows[:, None] * D + o_d[None, :])
    b_m = tl.full([G], float("-inf"), tl.float32)
    b_l = tl.zeros([G], tl.float32)
    b_acc = tl.zeros([G, D], tl.float32)
    b_sum = tl.zeros([BC, D], tl.float32)
    p_s = sink + (i_bh * G).to(tl.int64) * SINK_STRIDE
    for i0 in range(lo, hi, BC):
        b_k = d_k.load([i_b, i0, i_h, 0]).reshape(BC, D)
        b_v = d_v.load([i_b, i0, i_h, 0]).reshape(BC, D)
        if MODE == 0 or MODE == 4:
            b_sum += b_k.to(tl.float32) + b_v.to(tl.float32)
        else:
            b_s = tl.dot(b_q, tl.trans(b_k)) * qk_scale  # [G, BC]
            if MODE == 1:
                b_acc += tl.dot(b_s.to(b_v.dtype), b_v)
            else:
                if MODE == 3:  # block masses of 4-token blocks (l = 32, d = 16, l' = 64)
                    store_scores(b_s, b_m, i0, tl.arange(0, BC) >= 0, p_s, SINK_STRIDE, G, G, BC, 2, "evict_last", 4, 32, 16, 64)
                b_m, b_l, b_acc = online_softmax_step(b_s, b_v, b_m, b_l, b_acc, "tf32")
    p_o = out + (i_s * tl.num_programs(1) * G + rows)[:, None] * D + o_d[None, :]
    if MODE == 0 or MODE == 4:
        tl.store(p_o, tl.broadcast_to(tl.sum(b_sum, 0)[None, :], [G, D]))
    else:
        tl.store(p_o, b_acc)
    tl.store(m_out + i_s * tl.num_programs(1) * G + rows, b_m)
    tl.store(l_out + i_s * tl.num_programs(1) * G + rows, b_l)


def mean_launch_us(fn: Callable[[], object], launches: int = 50) -> float:
    """Mean time of ``launches`` back-to-back calls after a warm-up, us."""
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(launches):
        fn()
    end.record()
    torch.cuda.synchronize()
    return 1e3 * start.elapsed_time(end) / launches


def probe(k: torch.Tensor, v: torch.Tensor, q: torch.Tensor, mode: str, splits: int, bc: int, stages: int,
          warps: int) -> Tuple[Callable[[], object], torch.Tensor, torch.Tensor, torch.Tensor]:
    """A launch of ``probe_kernel`` and its outputs (poisoned with NaN before the first launch)."""
    B, T = k.shape[:2]
    programs = B * H
    if mode == "stream_rows":  # one program a (split, row) over all KV heads: tiles of bc/H tokens, contiguous
        k, v, T, programs = k.view(B, T * H, 1, D), v.view(B, T * H, 1, D), T * H, B
    d_k, d_v = (TensorDescriptor(t, list(t.shape), list(t.stride()), [1, bc, 1, D]) for t in (k, v))
    out = torch.full((splits, B * H * G, D), float("nan"), device=k.device)
    m_out, l_out = (torch.full((splits, B * H * G), float("nan"), device=k.device) for _ in range(2))
    sink_stride = triton.cdiv(T, bc) * (bc // 4 + 2)
    sink = torch.empty(B * H * G, sink_stride, device=k.device)
    scale = D**-0.5 * LOG2E

    def launch():
        return probe_kernel[(splits, programs)](q, d_k, d_v, out, m_out, l_out, sink, T, scale, splits, sink_stride,
                                             H=H, G=G, D=D, BC=bc, MODE=MODES[mode], num_warps=warps,
                                             num_stages=stages)

    return launch, out, m_out, l_out


def profiled_us(fn: Callable[[], object], launches: int = 20) -> float:
    """The probe kernel's own time (CUDA profiler, mean of ``launches`` launches), us: what the
    library's kernels are given in (``gpu_decode.kernel_breakdown``)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(launches):
            fn()
        torch.cuda.synchronize()
    rows = [e for e in prof.key_averages() if "probe_kernel" in e.key]
    return sum(getattr(e, "device_time", None) or e.cuda_time for e in rows) / max(1, len(rows))


def programs_per_sm(kernel, warps: int) -> int:
    """How many programs of a compiled kernel one SM holds, by its registers and shared memory
    (an H100/H200 SM: 64 K registers, 227 KiB of shared memory for programs, 32 programs)."""
    by_regs = 65536 // max(1, kernel.n_regs * 32 * warps)
    by_smem = 232448 // max(1, kernel.metadata.shared + 1024)
    return min(32, by_regs, by_smem)


def check(k, v, q, mode, splits, bc, out, m_out, l_out) -> str:
    """Relative error of the probe's outputs against PyTorch (``stream`` and ``softmax`` only)."""
    B, T = k.shape[:2]
    chunk = triton.cdiv(triton.cdiv(T, splits), bc) * bc
    if mode == "stream_rows":
        rows_k, rows_v = k.reshape(B, T * H, D), v.reshape(B, T * H, D)
        chunk = triton.cdiv(triton.cdiv(T * H, splits), bc) * bc
        want = torch.stack([(rows_k[:, s * chunk:(s + 1) * chunk] + rows_v[:, s * chunk:(s + 1) * chunk]).float().sum(1)
                            for s in range(splits)])  # [splits, B, D]
        got = out.view(-1, D)[:splits * B * G].view(splits, B, G, D)[:, :, 0]  # rows of B programs a split
    elif mode == "stream":
        want = torch.stack([(k[:, s * chunk:(s + 1) * chunk] + v[:, s * chunk:(s + 1) * chunk]).float().sum(1)
                            for s in range(splits)])  # [splits, B, H, D]
        got = out.view(splits, B, H, G, D)[:, :, :, 0]
    elif mode == "softmax":
        qg = q.view(B, H, G, D).float()
        parts = []
        for s in range(splits):
            ks, vs = k[:, s * chunk:(s + 1) * chunk].float(), v[:, s * chunk:(s + 1) * chunk].float()
            logits = torch.einsum("bhgd,bthd->bhgt", qg, ks) * D**-0.5 * LOG2E
            p = torch.exp2(logits - logits.amax(-1, keepdim=True))
            parts.append(torch.einsum("bhgt,bthd->bhgd", p / p.sum(-1, keepdim=True), vs))
        want = torch.stack(parts)
        got = (out / l_out[..., None]).view(splits, B, H, G, D)
    else:
        return "-"
    return f"{float((got - want).norm() / want.norm()):.1e}"


def library_kernels(B: int, S: int) -> str:
    """The library's decode kernels at their default launch, eager, PDL off (profiler averages)."""
    from gpu_decode import kernel_breakdown, make_inputs

    return kernel_breakdown(make_inputs(B, S))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--context", type=int, default=65536)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    torch.manual_seed(0)
    B, T = args.batch, args.context // 16
    dev = torch.device("cuda")
    k, v = (torch.randn(B, T, H, D, device=dev, dtype=torch.bfloat16) for _ in range(2))
    q = torch.randn(B * H * G, D, device=dev, dtype=torch.bfloat16)
    mbytes = 2 * k.numel() * k.element_size() / 1e6
    print(f"# Compressed-pass probes: {torch.cuda.get_device_name()}, batch {B}, {T} compressed tokens "
          f"({mbytes:.0f} MB of keys and values); torch {torch.__version__}, triton {triton.__version__}\n")
    print(f"Each probe timed in {args.rounds} rounds (every probe once a round); us and TB/s of the median "
          f"round, the rounds' range in brackets. Programs an SM: as many as its registers and shared memory "
          f"allow (the library's kernel holds 3).\n")
    print("| probe | splits | token tile | stages | warps | registers | shared KiB | programs an SM | us | TB/s "
          "| us (profiler) | rel. error |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|")
    shapes: List[Tuple[int, int, int, int]] = [(6, 32, 3, 4), (6, 64, 2, 4), (6, 32, 4, 4), (8, 32, 2, 4),
                                               (12, 32, 2, 4), (6, 64, 3, 8), (6, 32, 5, 4), (6, 32, 6, 4)]
    runs, times = [], {}
    shapes_of = {mode: shapes for mode in MODES}
    # the same 384 programs and 8 KiB key tiles: 24 splits of a row, 32 rows = 8 tokens x 4 heads
    shapes_of["stream_rows"] = [(24, 32, 3, 4), (24, 32, 4, 4), (24, 64, 2, 4), (24, 128, 2, 4), (12, 64, 3, 4),
                                (48, 32, 2, 4)]
    for mode in MODES:
        for shape in shapes_of[mode]:
            try:
                launch, out, m_out, l_out = probe(k, v, q, mode, *shape)
                compiled = launch()
                runs.append((mode, shape, launch, compiled, check(k, v, q, mode, shape[0], shape[1], out, m_out, l_out)))
            except Exception as exc:  # noqa: BLE001 - a shape that does not compile is reported
                print(f"| {mode} | " + " | ".join(map(str, shape)) + f" | failed: {type(exc).__name__} "
                      f"{str(exc).splitlines()[0][:80]} | | | | | | |")
    for _ in range(args.rounds):
        for mode, shape, launch, _compiled, _err in runs:
            times.setdefault((mode, shape), []).append(mean_launch_us(launch))
    for mode, shape, launch, compiled, err in runs:
        ts = sorted(times[(mode, shape)])
        us = ts[len(ts) // 2]
        print(f"| {mode} | " + " | ".join(map(str, shape)) + f" | {compiled.n_regs} | "
              f"{compiled.metadata.shared / 1024:.1f} | {programs_per_sm(compiled, shape[3])} | {us:.1f} "
              f"({ts[0]:.1f}-{ts[-1]:.1f}) | {mbytes / us:.2f} | {profiled_us(launch):.1f} | {err} |")
    kc = k.clone()
    us = mean_launch_us(lambda: (kc.copy_(k), kc.copy_(v)))
    print(f"\nPyTorch copies of the keys and of the values (read and write each): {us:.1f} us, "
          f"{2 * mbytes / us:.2f} TB/s moved")
    print(f"The library's decode kernels at batch {B}, {args.context} (eager, PDL off): "
          f"{library_kernels(B, args.context)}")


if __name__ == "__main__":
    main()
