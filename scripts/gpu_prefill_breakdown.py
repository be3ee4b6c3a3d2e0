"""Where NSA prefill time goes on a GPU: every op alone, forward and forward+backward.

Usage: ``python scripts/gpu_prefill_breakdown.py [--lengths 8192 65536] [--variants] [--csv out.csv]``

1. Correctness of the block selection at real sizes: the Triton selection over the
   whole sequence against the float32 reference on the last queries (``q_offset``),
   as the share of (query, group) rows with identical blocks.
2. ``triton.testing.do_bench`` medians (ms, L2 flushed) at B = 1, 64 query heads,
   4 KV heads, head dim 128, bf16, paper defaults, every op on its Triton kernel:
   mean compression, compressed attention with and without the selection, the
   selection alone, selected attention, sliding window, the whole ``nsa_attention``,
   and dense causal SDPA (flash and cuDNN) in the same run.
"""

from __future__ import annotations

import argparse
import csv
import sys
from typing import Callable, Dict, List

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

from nsa import NSAConfig
from nsa.bench.workloads import Shape, prefill_inputs
from nsa.ops import (
    compressed_attention,
    mean_compress,
    nsa_attention,
    select_blocks,
    selected_attention,
    sliding_window_attention,
)
from nsa.ops._triton.block_topn import block_topn
from nsa.ops._triton.compressed_fwd import compressed_fwd
from nsa.ops.compressed.kernel import compressed_attention_select

DEV = "cuda"
HQ, H, D = 64, 4, 128


def ms(fn: Callable[[], object]) -> float:
    return do_bench(fn, warmup=50, rep=300, return_mode="median")


def fwd_bwd(fn: Callable[[], object], inputs: List[torch.Tensor]) -> Callable[[], object]:
    """Forward, then gradients of every input against a fixed random output gradient."""
    out = fn()
    outs = out if isinstance(out, tuple) else (out,)
    grads = [torch.randn_like(o) if o.is_floating_point() else None for o in outs]

    def run():
        res = fn()
        res = res if isinstance(res, tuple) else (res,)
        pairs = [(o, g) for o, g in zip(res, grads) if g is not None and o.requires_grad]
        return torch.autograd.grad([o for o, _ in pairs], inputs, [g for _, g in pairs])

    return run


def dense(q, k, v, backend):
    from torch.nn.attention import sdpa_kernel

    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True)


def check_selection(T: int, config: NSAConfig, tail: int = 256) -> str:
    q = torch.randn(1, T, HQ, D, device=DEV, dtype=torch.bfloat16)
    k_cmp = torch.randn(1, config.num_cmp(T), H, D, device=DEV, dtype=torch.bfloat16)
    idx = select_blocks(q, k_cmp, config, backend="triton")
    ref = select_blocks(q[:, -tail:].float(), k_cmp.float(), config, q_offset=T - tail, backend="reference")
    same = (idx[:, -tail:] == ref).all(-1).float().mean().item()
    _, _, idx_fused = compressed_attention_select(q, k_cmp, k_cmp, config, config.softmax_scale(D), 0)
    fused_same = torch.equal(idx_fused, idx)
    return f"T={T}: last {tail} queries, rows equal to the float32 reference {same:.2%}; fused == select: {fused_same}"


def breakdown(T: int, config: NSAConfig, variants: bool) -> Dict[str, float]:
    torch.manual_seed(T)
    q, k, v, gates, _ = prefill_inputs("nsa", Shape.default(torch.device(DEV), 1, T), torch.device(DEV), backward=True)
    k_cmp = mean_compress(k.detach(), config).requires_grad_()
    v_cmp = mean_compress(v.detach(), config).requires_grad_()
    scale = config.softmax_scale(D)
    with torch.no_grad():
        idx = select_blocks(q, k_cmp, config, backend="triton")
    t = "triton"
    row: Dict[str, float] = {"T": T}
    with torch.no_grad():
        row["mean pool k+v"] = ms(lambda: (mean_compress(k, config, backend=t), mean_compress(v, config, backend=t)))
        row["cmp fwd"] = ms(lambda: compressed_attention(q, k_cmp, v_cmp, config, backend=t))
        row["select"] = ms(lambda: select_blocks(q, k_cmp, config, backend=t))
        row["cmp+select fwd"] = ms(lambda: compressed_attention_select(q, k_cmp, v_cmp, config, scale, 0))
        row["slc fwd"] = ms(lambda: selected_attention(q, k, v, idx, config, backend=t))
        row["win fwd"] = ms(lambda: sliding_window_attention(q, k, v, config, backend=t))
        row["nsa fwd"] = ms(lambda: nsa_attention(q, k, v, gates, config, backend=t))
    row["cmp fwd+bwd"] = ms(fwd_bwd(lambda: compressed_attention(q, k_cmp, v_cmp, config, backend=t)[0], [q, k_cmp, v_cmp]))
    row["slc fwd+bwd"] = ms(fwd_bwd(lambda: selected_attention(q, k, v, idx, config, backend=t), [q, k, v]))
    row["win fwd+bwd"] = ms(fwd_bwd(lambda: sliding_window_attention(q, k, v, config, backend=t), [q, k, v]))
    row["nsa fwd+bwd"] = ms(fwd_bwd(lambda: nsa_attention(q, k, v, gates, config, backend=t), [q, k, v, gates]))
    from torch.nn.attention import SDPBackend

    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            with torch.no_grad():
                row[f"dense {name} fwd"] = ms(lambda: dense(q, k, v, backend))
            row[f"dense {name} fwd+bwd"] = ms(fwd_bwd(lambda: dense(q, k, v, backend), [q, k, v]))
        except RuntimeError as err:  # a backend that refuses this shape
            print(f"dense {name}: {err}", file=sys.stderr)
    if variants:
        qd, kd, vd = q.detach(), k_cmp.detach(), v_cmp.detach()
        for rows, nb in ((64, 16), (128, 32), (64, 32)):
            try:
                row[f"cmp+select rows={rows} nb={nb}"] = ms(lambda: compressed_fwd(
                    qd, kd, vd, config, scale, 0, select=True, rows=rows, blocks_per_step=nb))
            except Exception as err:  # noqa: BLE001 - a variant that does not fit is reported, not fatal
                print(f"variant rows={rows} nb={nb}: {type(err).__name__}: {err}", file=sys.stderr)
        scores = torch.rand(1, 16384, H, 2, T // 64, device=DEV)
        block_idx = torch.empty(1, T, H, 16, dtype=torch.int32, device=DEV)
        row["top-n of 16k queries"] = ms(lambda: block_topn(scores, block_idx, T - 16384, T - 16384, 64, 1, 2))
        row["top-n of 16k queries, 4 rows 4 warps"] = ms(lambda: block_topn(
            scores, block_idx, T - 16384, T - 16384, 64, 1, 2, rows_per_program=4, num_warps=4))
        from nsa.ops.compressed.kernel import compressed_bwd

        o, lse, _ = compressed_fwd(qd, kd, vd, config, scale, 0)
        do = torch.randn_like(o)
        # dK/dV tiles alone (dq keeps the default): (rows, block_n, warps, stages)
        for dkdv in ((64, 64, 4, 2), (128, 64, 8, 2), (128, 64, 4, 2), (64, 128, 8, 2), (32, 64, 4, 2),
                     (64, 64, 4, 3), (128, 32, 4, 2)):
            try:
                row["cmp bwd dkdv=" + "/".join(map(str, dkdv))] = ms(lambda: compressed_bwd(
                    qd, kd, vd, o, lse, do, None, config, scale, 0, dkdv=dkdv))
            except Exception as err:  # noqa: BLE001
                print(f"dkdv variant {dkdv}: {type(err).__name__}: {err}", file=sys.stderr)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 16384, 32768, 65536])
    parser.add_argument("--variants", action="store_true", help="also time launch variants at the shortest and longest length")
    parser.add_argument("--csv", help="write the rows as CSV")
    args = parser.parse_args()
    config = NSAConfig()
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}, triton {triton.__version__}, CUDA {torch.version.cuda}")
    print(check_selection(8192, config), flush=True)
    print(check_selection(max(args.lengths), config), flush=True)
    rows = []
    for T in args.lengths:
        rows.append(breakdown(T, config, args.variants and T in (min(args.lengths), max(args.lengths))))
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in rows[-1].items()}, flush=True)
        torch.cuda.empty_cache()
    keys = list(dict.fromkeys(k for r in rows for k in r))
    print("\n| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(f"{r[k]:.3f}" if isinstance(r.get(k), float) else str(r.get(k, "")) for k in keys) + " |")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
