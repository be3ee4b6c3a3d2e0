"""Check and time the compression, compressed-attention and selection kernels on a GPU.

Usage: ``python scripts/gpu_compressed_select.py [--lengths 8192 65536] [--quick]``

1. Correctness at real sizes, bfloat16 inputs against the float32 reference
   (``nsa.ops.*.reference`` on upcast inputs): relative error of ``o``, ``lse``
   and every gradient, and for the selection the share of (query, group) rows
   whose blocks equal the reference's, plus the largest score gap among rows
   that differ (a near-tie when tiny).
2. Timings (``triton.testing.do_bench`` medians, ms) at B = 1, 64 query heads,
   4 KV heads, head dim 128, paper defaults, with dense causal SDPA as baseline,
   and a few launch variants of the fused forward and the backward.

The table comes last; paste it into ``docs/perf/compressed_select.md``.
"""

from __future__ import annotations

import argparse
import time

import torch
import triton
from triton.testing import do_bench

from nsa import NSAConfig
from nsa.ops._triton.compressed_fwd import compressed_fwd
from nsa.ops.compress import kernel as compress_kernel
from nsa.ops.compress import reference as compress_ref
from nsa.ops.compressed import kernel as cmp_kernel
from nsa.ops.compressed import reference as cmp_ref
from nsa.ops.select import reference as select_ref
from nsa.ops.select.reference import overlap_weights
from nsa.ops._reference import masked_softmax, split_groups
from nsa.ops.compressed.reference import visible_cmp_count
from nsa.testing import rel_error

DEV = "cuda"


def inputs(B, T, HQ, H, DK, DV, config, dtype=torch.bfloat16):
    nc = config.num_cmp(T)
    q = torch.randn(B, T, HQ, DK, device=DEV, dtype=dtype)
    k = torch.randn(B, nc, H, DK, device=DEV, dtype=dtype)
    v = torch.randn(B, nc, H, DV, device=DEV, dtype=dtype)
    return q, k, v


def group_scores(q, k, config):
    """float32 reference scores ``[B, T, H, nblk]`` for the rows that differ (small T only)."""
    B, T, HQ, D = q.shape
    H, nc = k.shape[2], k.shape[1]
    pos = torch.arange(T, device=DEV)
    vis = torch.arange(nc, device=DEV)[None, :] < visible_cmp_count(pos, config)[:, None]
    s = torch.einsum("bchgd,bshd->bhgcs", split_groups(q.float(), H), k.float()) * config.softmax_scale(D)
    p, _ = masked_softmax(s, vis)
    nblk = (T - 1) // config.sel_block + 1
    return torch.matmul(p, overlap_weights(nc, nblk, config, DEV, torch.float32)).sum(2).permute(0, 2, 1, 3)


def selection_report(idx, ref_idx, q, k, config):
    """(share of rows equal, largest relative score gap between a chosen and a dropped block)."""
    same = (idx.long() == ref_idx.long()).all(-1)
    if bool(same.all()):
        return 1.0, 0.0
    score = group_scores(q, k, config)
    rows = (~same).nonzero().tolist()[:64]
    worst = 0.0
    for b, t, h in rows:
        mine = set(idx[b, t, h].tolist()) - {-1}
        theirs = set(ref_idx[b, t, h].tolist()) - {-1}
        a = score[b, t, h, list(mine - theirs)].min().item()
        c = score[b, t, h, list(theirs - mine)].max().item()
        worst = max(worst, (c - a) / max(abs(c), 1e-30))
    return same.float().mean().item(), worst


def check(B, T, HQ, H, DK, DV, config, results):
    q, k, v = inputs(B, T, HQ, H, DK, DV, config)
    scale = config.softmax_scale(DK)
    qs, ks, vs = (x.clone().requires_grad_() for x in (q, k, v))
    o, lse, idx = cmp_kernel.compressed_attention_select(qs, ks, vs, config, scale, 0)
    do = torch.randn_like(o)
    o.backward(do)
    qr, kr, vr = (x.float().requires_grad_() for x in (q, k, v))
    o_ref, lse_ref = cmp_ref.compressed_attention(qr, kr, vr, config, scale, 0)
    o_ref.backward(do.float())
    fin = torch.isfinite(lse_ref)
    ref_idx = select_ref.select_blocks(q.float(), k.float(), config, scale, 0)
    share, gap = selection_report(idx, ref_idx, q, k, config)
    x = torch.randn(B, T, H, DK, device=DEV, dtype=torch.bfloat16)
    name = f"B{B}-T{T}-HQ{HQ}-H{H}-Dk{DK}-Dv{DV}"
    errs = dict(
        o=rel_error(o, o_ref), lse=rel_error(lse[fin], lse_ref[fin]),
        dq=rel_error(qs.grad, qr.grad), dk=rel_error(ks.grad, kr.grad), dv=rel_error(vs.grad, vr.grad),
        pool=rel_error(compress_kernel.mean_compress(x, config), compress_ref.mean_compress(x.float(), config)),
    )
    ok = all(e <= 1e-2 for e in errs.values()) and share > 0.999 and gap < 1e-3
    results.append(f"{'PASS' if ok else 'FAIL'} {name}: " + " ".join(f"{k}={e:.1e}" for k, e in errs.items())
                   + f" rows_equal={share:.5f} max_gap={gap:.1e}")


def bench(fn):
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def timings(T, config, table, variants):
    B, HQ, H, D = 1, 64, 4, 128
    q, k_raw, v_raw = (torch.randn(B, T, n, D, device=DEV, dtype=torch.bfloat16) for n in (HQ, H, H))
    k = compress_kernel.mean_compress(k_raw, config)
    v = compress_kernel.mean_compress(v_raw, config)
    scale = config.softmax_scale(D)
    row = {"T": T}
    row["pool k+v"] = bench(lambda: (compress_kernel.mean_compress(k_raw, config),
                                     compress_kernel.mean_compress(v_raw, config)))
    row["cmp fwd"] = bench(lambda: compressed_fwd(q, k, v, config, scale, 0))
    row["select"] = bench(lambda: compressed_fwd(q, k, k, config, scale, 0, store_o=False, select=True))
    row["fused"] = bench(lambda: compressed_fwd(q, k, v, config, scale, 0, select=True))
    o, lse, idx = compressed_fwd(q, k, v, config, scale, 0, select=True)
    o2, _, _ = compressed_fwd(q, k, v, config, scale, 0)
    _, _, idx2 = compressed_fwd(q, k, k, config, scale, 0, store_o=False, select=True)
    row["fused==separate"] = f"{rel_error(o, o2):.0e}/{bool(torch.equal(idx, idx2))}"
    do = torch.randn_like(o)
    row["cmp bwd"] = bench(lambda: cmp_kernel.compressed_bwd(q, k, v, o, lse, do, None, config, scale, 0))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k_raw, v_raw))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    row["sdpa fwd"] = bench(lambda: sdpa(qt, kt, vt, is_causal=True, enable_gqa=True))
    qg, kg, vg = (x.detach().requires_grad_() for x in (qt, kt, vt))
    out = sdpa(qg, kg, vg, is_causal=True, enable_gqa=True)
    g = torch.randn_like(out)
    row["sdpa f+b"] = row["sdpa fwd"] + bench(lambda: torch.autograd.grad(out, (qg, kg, vg), g, retain_graph=True))
    table.append(row)
    for rows, warps, stages in variants:
        ms = bench(lambda: compressed_fwd(q, k, v, config, scale, 0, select=True, rows=rows, num_warps=warps,
                                          num_stages=stages))
        table.append({"T": T, "variant": f"fused rows={rows} warps={warps} stages={stages}", "ms": ms})
    for rows, bn, warps in ((64, 64, 4), (128, 32, 8), (128, 64, 8)):
        # both kernels on the variant's tiles (dkdv= overrides the dK/dV kernel's own DKDV_TILES)
        ms = bench(lambda: cmp_kernel.compressed_bwd(q, k, v, o, lse, do, None, config, scale, 0, rows=rows,
                                                     block_n=bn, num_warps=warps, dkdv=(rows, bn, warps, 2)))
        table.append({"T": T, "variant": f"bwd rows={rows} block_n={bn} warps={warps}", "ms": ms})


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 65536])
    parser.add_argument("--quick", action="store_true", help="correctness only")
    args = parser.parse_args()
    print(f"device {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__} "
          f"{time.strftime('%Y-%m-%d')}", flush=True)
    config = NSAConfig()
    results = []
    t0 = time.time()
    for shape in ((1, 8192, 64, 4, 128, 128), (1, 3001, 16, 1, 192, 128), (2, 2053, 16, 16, 64, 64),
                  (1, 4099, 64, 16, 128, 128)):
        check(*shape, config, results)
        print(results[-1], f"({time.time() - t0:.0f}s)", flush=True)
    table = []
    if not args.quick:
        for T in args.lengths:
            timings(T, config, table, [(64, 4, 2), (128, 8, 3), (256, 8, 2)] if T == max(args.lengths) else [])
            print(table[-1], flush=True)
    print("\n== correctness (bf16 vs float32 reference) ==")
    print("\n".join(results))
    print("\n== timings, ms (median) ==")
    for row in table:
        print(" | ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))


if __name__ == "__main__":
    main()
