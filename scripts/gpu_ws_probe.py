"""Does Triton's warp specialisation pay for an attention loop on Hopper? A probe, no library code.

Why: the compressed and window kernels run at 50-75 % of cuDNN's dense rate, and Nsight Compute
finds their warps waiting on barriers (the compressed dK/dV: 24-28 % of its cycles). Warp
specialisation (a producer warp issuing bulk copies, the others computing) is what closes that gap
in hand-written Hopper kernels. Session 16 found Triton 3.6 unable to compile it for the window
kernels at 4 warps; session 59 found, compiling offline for sm_90, that a plain flash-attention
forward loop over tensor-descriptor loads does compile with ``tl.range(..., warp_specialize=True)``
at 4 warps (the kernel below; with pointer loads the compile fails, and at 8 warps Triton leaves the
loop as it is).

The loop here has the compressed forward's shape: rows are ``BM`` (query position, head) pairs of
one KV group, keys a shared ``[N, 128]`` tile stream of that group, bf16 in, float32 softmax, one
output tile per program. Each configuration is checked against torch (float32) on a small problem,
then timed (``do_bench`` median, L2 flushed) on ``--rows`` rows per group, 4 groups, ``--keys`` keys::

    python scripts/gpu_ws_probe.py [--rows 262144] [--keys 2048]

Prints one line per configuration: ms, TFLOP/s (4 * rows * keys * 128 flops a group), the error.
Session 59, H200 (docs/perf/prefill.md): specialised, the loop took 1.7-1.9 times as long as the same
descriptor loads unspecialised and returned NaN with 3 stages; its 128-row form did not compile
within 3 minutes. The best plain loop: 128 rows, 4 warps, 64-key tiles, 2 stages, 511 TFLOP/s.
"""

from __future__ import annotations

import argparse
import itertools

import torch
import triton
import triton.language as tl
from triton.testing import do_bench
from triton.tools.tensor_descriptor import TensorDescriptor

D = 128
GROUPS = 4


@triton.jit
def _softmax_step(b_q, b_k, b_v, b_m, b_l, b_acc, qk_scale):
    """One key tile of the online softmax (log2 domain): the running max, sum and output."""
    b_s = tl.dot(b_q, b_k.T) * qk_scale
    m_new = tl.maximum(b_m, tl.max(b_s, 1))
    b_p = tl.exp2(b_s - m_new[:, None])
    alpha = tl.exp2(b_m - m_new)
    b_l = b_l * alpha + tl.sum(b_p, 1)
    b_acc = tl.dot(b_p.to(tl.bfloat16), b_v, b_acc * alpha[:, None])
    return m_new, b_l, b_acc


@triton.jit
def attn_fwd_desc_kernel(q_desc, k_desc, v_desc, o, ROWS, N, qk_scale,
                         BM: tl.constexpr, BN: tl.constexpr, WS: tl.constexpr, STAGES: tl.constexpr):
    """One ``BM``-row tile of group ``program_id(1)`` over all ``N`` keys of that group; keys and
    values by tensor-descriptor copies, the key loop warp-specialised with ``WS``."""
    i_m, i_g = tl.program_id(0), tl.program_id(1)
    row0 = i_g * ROWS + i_m * BM
    b_q = q_desc.load([row0, 0])
    b_m = tl.full([BM], float("-inf"), tl.float32)
    b_l = tl.zeros([BM], tl.float32)
    b_acc = tl.zeros([BM, 128], tl.float32)
    for n in tl.range(0, N, BN, num_stages=STAGES, warp_specialize=WS):
        b_k = k_desc.load([i_g * N + n, 0])
        b_v = v_desc.load([i_g * N + n, 0])
        b_m, b_l, b_acc = _softmax_step(b_q, b_k, b_v, b_m, b_l, b_acc, qk_scale)
    b_acc = b_acc / b_l[:, None]
    o_r = row0 + tl.arange(0, BM)
    tl.store(o + o_r[:, None].to(tl.int64) * 128 + tl.arange(0, 128)[None, :], b_acc.to(tl.bfloat16))


@triton.jit
def attn_fwd_ptr_kernel(q, k, v, o, ROWS, N, qk_scale, BM: tl.constexpr, BN: tl.constexpr, STAGES: tl.constexpr):
    """The same loop with pointer loads, pipelined by the compiler: how the library's kernels load."""
    i_m, i_g = tl.program_id(0), tl.program_id(1)
    o_d = tl.arange(0, 128)
    o_r = (i_g * ROWS + i_m * BM + tl.arange(0, BM)).to(tl.int64)
    b_q = tl.load(q + o_r[:, None] * 128 + o_d[None, :])
    b_m = tl.full([BM], float("-inf"), tl.float32)
    b_l = tl.zeros([BM], tl.float32)
    b_acc = tl.zeros([BM, 128], tl.float32)
    for n in tl.range(0, N, BN, num_stages=STAGES):
        o_n = (i_g * N + n + tl.arange(0, BN)).to(tl.int64)
        b_k = tl.load(k + o_n[:, None] * 128 + o_d[None, :])
        b_v = tl.load(v + o_n[:, None] * 128 + o_d[None, :])
        b_m, b_l, b_acc = _softmax_step(b_q, b_k, b_v, b_m, b_l, b_acc, qk_scale)
    b_acc = b_acc / b_l[:, None]
    tl.store(o + o_r[:, None] * 128 + o_d[None, :], b_acc.to(tl.bfloat16))


def _alloc(size: int, alignment: int, stream) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda")


def run(kind: str, q, k, v, rows: int, n: int, bm: int, bn: int, warps: int, stages: int):
    o = torch.empty_like(q)
    scale = D ** -0.5 * 1.4426950408889634
    grid = (rows // bm, GROUPS)
    if kind == "ptr":
        def call():
            attn_fwd_ptr_kernel[grid](q, k, v, o, rows, n, scale, BM=bm, BN=bn, STAGES=stages, num_warps=warps)
    else:
        qd = TensorDescriptor(q, list(q.shape), list(q.stride()), [bm, D])
        kd = TensorDescriptor(k, list(k.shape), list(k.stride()), [bn, D])
        vd = TensorDescriptor(v, list(v.shape), list(v.stride()), [bn, D])

        def call():
            attn_fwd_desc_kernel[grid](qd, kd, vd, o, rows, n, scale, BM=bm, BN=bn, WS=(kind == "ws"),
                                       STAGES=stages, num_warps=warps)
    return o, call


def reference(q, k, v, rows: int, n: int) -> torch.Tensor:
    out = []
    for g in range(GROUPS):
        s = q[g * rows:(g + 1) * rows].float() @ k[g * n:(g + 1) * n].float().T * D ** -0.5
        out.append(torch.softmax(s, -1) @ v[g * n:(g + 1) * n].float())
    return torch.cat(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=262144, help="rows per group (multiple of 128)")
    ap.add_argument("--keys", type=int, default=2048, help="keys per group (multiple of 128)")
    ap.add_argument("--kinds", nargs="+", default=["ptr", "desc", "ws"], choices=["ptr", "desc", "ws"],
                    help="loads timed: pointers, descriptors, descriptors with the loop specialised")
    ap.add_argument("--rows-per-tile", type=int, nargs="+", default=[64, 128], help="BM values timed")
    args = ap.parse_args()
    triton.set_allocator(_alloc)
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; "
          f"{GROUPS} groups x {args.rows} rows x {args.keys} keys, head dim {D}")
    gen = torch.Generator(device="cuda").manual_seed(59)
    small_rows, small_n = 512, 512
    sq = torch.randn(GROUPS * small_rows, D, device="cuda", generator=gen).bfloat16()
    sk = torch.randn(GROUPS * small_n, D, device="cuda", generator=gen).bfloat16()
    sv = torch.randn(GROUPS * small_n, D, device="cuda", generator=gen).bfloat16()
    want = reference(sq, sk, sv, small_rows, small_n)
    q = torch.randn(GROUPS * args.rows, D, device="cuda", generator=gen).bfloat16()
    k = torch.randn(GROUPS * args.keys, D, device="cuda", generator=gen).bfloat16()
    v = torch.randn(GROUPS * args.keys, D, device="cuda", generator=gen).bfloat16()
    flops = 4.0 * GROUPS * args.rows * args.keys * D
    tiles = list(itertools.product(args.rows_per_tile, (64, 128)))
    configs = [("ptr", bm, bn, w, s) for (bm, bn), w, s in itertools.product(tiles, (4, 8), (2, 3))]
    configs += [(kind, bm, bn, 4, s) for kind in ("desc", "ws") for (bm, bn), s in itertools.product(tiles, (2, 3))]
    configs += [("desc", bm, bn, 8, s) for (bm, bn), s in itertools.product(tiles, (2, 3)) if bm == 128]
    for kind, bm, bn, warps, stages in (c for c in configs if c[0] in args.kinds):
        name = f"{kind:4s} BM={bm:3d} BN={bn:3d} warps={warps} stages={stages}"
        try:
            o, call = run(kind, sq, sk, sv, small_rows, small_n, bm, bn, warps, stages)
            o.fill_(float("nan"))
            call()
            err = (o.float() - want).abs().max().item()
            _, call = run(kind, q, k, v, args.rows, args.keys, bm, bn, warps, stages)
            ms = do_bench(call, warmup=10, rep=200, return_mode="median")
            print(f"{name}: {ms:8.3f} ms {flops / ms / 1e9:6.1f} TFLOP/s  max error {err:.2e}", flush=True)
        except Exception as exc:  # a configuration that does not compile or fit is reported, not fatal
            print(f"{name}: failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}", flush=True)


if __name__ == "__main__":
    main()
