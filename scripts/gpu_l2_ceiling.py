"""How fast can SMs pull random 64-token K/V blocks out of L2? The ceiling under the selected forward.

The selected branch's forward fetches, for every query and KV group, its selected blocks of K and V
(64 tokens x 128 dims x 2 tensors, 32 KB in bf16) in an order no neighbouring query shares (random
inputs). At 8k the whole cache (4 KV heads, 16.8 MB) fits in the 50 MB L2, so the kernel is bound
by how fast L2 delivers such blocks, not by DRAM. This script measures that rate with nothing else
in the way: programs that each fetch ``R`` random blocks of a cache the selected kernel's shape and
only sum them (no matrix products), through plain loads or tensor-descriptor bulk copies, over a
grid of programs, warps and pipeline stages. The L2 is warm (no flush): the cache is read over and
over. Then it times the real selected forward at 8k with its inputs (``nsa.ops.selected``) and
prints both rates, and the floor that the best measured rate sets on the 8k forward's selected
branch.

Usage: ``python scripts/gpu_l2_ceiling.py [--length 8192] [--rounds 64]``.
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl
from triton.testing import do_bench
from triton.tools.tensor_descriptor import TensorDescriptor

SEL, D, H = 64, 128, 4


@triton.jit
def gather_blocks_kernel(k, v, table, out, R: tl.constexpr, NB: tl.constexpr, HS: tl.constexpr, D: tl.constexpr,
                         SEL: tl.constexpr):
    """Program ``p`` fetches the ``R`` (block, head) pairs of ``table[p]`` through plain loads."""
    pid = tl.program_id(0)
    o_t = tl.arange(0, SEL)
    o_d = tl.arange(0, D)
    # a running xor of the bits: one logic operation per two elements, no reduction in the loop
    acc = tl.zeros([SEL, D], tl.int16)
    for r in tl.range(R):
        code = tl.load(table + pid * R + r)
        j, h = code // HS, code % HS
        row = (j * SEL + o_t).to(tl.int64) * (HS * D) + h * D
        b_k = tl.load(k + row[:, None] + o_d[None, :])
        b_v = tl.load(v + row[:, None] + o_d[None, :])
        acc ^= b_k.to(tl.int16, bitcast=True) ^ b_v.to(tl.int16, bitcast=True)
    tl.store(out + pid * D + o_d, tl.xor_sum(acc, 0).to(tl.float32))


@triton.jit
def gather_blocks_desc_kernel(d_k, d_v, table, out, R: tl.constexpr, HS: tl.constexpr, D: tl.constexpr,
                              SEL: tl.constexpr):
    """The same through tensor descriptors: one bulk copy per block and tensor."""
    pid = tl.program_id(0)
    o_d = tl.arange(0, D)
    acc = tl.zeros([SEL, D], tl.int16)
    for r in tl.range(R):
        code = tl.load(table + pid * R + r)
        j, h = code // HS, code % HS
        b_k = d_k.load([j * SEL, h * D])
        b_v = d_v.load([j * SEL, h * D])
        acc ^= b_k.to(tl.int16, bitcast=True) ^ b_v.to(tl.int16, bitcast=True)
    tl.store(out + pid * D + o_d, tl.xor_sum(acc, 0).to(tl.float32))


def block_rate(T: int, programs: int, R: int, warps: int, stages: int, desc: bool) -> float:
    """TB/s of K+V block bytes fetched, L2 warm, ``do_bench`` median."""
    k = torch.randn(T, H * D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    nb = T // SEL
    table = torch.randint(0, nb * H, (programs, R), device="cuda", dtype=torch.int32)
    out = torch.empty(programs, D, device="cuda", dtype=torch.float32)
    if desc:
        d_k = TensorDescriptor.from_tensor(k, [SEL, D])
        d_v = TensorDescriptor.from_tensor(v, [SEL, D])
        fn = lambda: gather_blocks_desc_kernel[(programs,)](d_k, d_v, table, out, R=R, HS=H, D=D, SEL=SEL,  # noqa: E731
                                                             num_warps=warps, num_stages=stages)
    else:
        fn = lambda: gather_blocks_kernel[(programs,)](k, v, table, out, R=R, NB=nb, HS=H, D=D, SEL=SEL,  # noqa: E731
                                                        num_warps=warps, num_stages=stages)
    ms = do_bench(fn, warmup=50, rep=300, return_mode="median")
    return programs * R * 2 * SEL * D * 2 / (ms * 1e-3) / 1e12


def selected_bytes(T: int, n: int = 16, forced: int = 3) -> int:
    """Bytes of K and V that the selected forward fetches per KV head at length ``T`` when the forced
    blocks (initial and local, computed by the window kernels) are left out: per query the
    ``min(n, visible) - min(forced, visible)`` other blocks."""
    blocks = 0
    for t in range(T):
        vis = t // SEL + 1
        blocks += min(n, vis) - min(forced, vis)
    return blocks * 2 * SEL * D * 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=64, help="blocks each program fetches")
    parser.add_argument("--per-sm", type=int, nargs="+", default=[2, 4, 8], help="programs per SM")
    parser.add_argument("--warps", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--stages", type=int, nargs="+", default=[2, 3, 4])
    args = parser.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}, triton {triton.__version__}; "
          f"cache {args.length} tokens x {H} heads (K+V {args.length * H * D * 4 / 2**20:.1f} MiB), L2 warm")
    best = 0.0
    print("| loads | programs | warps | stages | TB/s |\n|---|---:|---:|---:|---:|")
    for desc in (False, True):
        for per_sm in args.per_sm:
            for warps in args.warps:
                for stages in args.stages:
                    try:
                        rate = block_rate(args.length, per_sm * sms, args.rounds, warps, stages, desc)
                    except Exception as err:  # noqa: BLE001 - a launch that does not fit is reported, not fatal
                        print(f"| {'bulk copies' if desc else 'plain'} | {per_sm * sms} | {warps} | {stages} | "
                              f"failed: {type(err).__name__} |")
                        continue
                    best = max(best, rate)
                    print(f"| {'bulk copies' if desc else 'plain'} | {per_sm * sms} | {warps} | {stages} | {rate:.2f} |",
                          flush=True)
    per_head = selected_bytes(args.length)
    total = per_head * H
    print(f"\nselected forward at {args.length} (B=1, {H} KV heads, forced blocks left out): {total / 1e9:.2f} GB of "
          f"K/V blocks; at the best measured rate {best:.2f} TB/s that is at least {total / best / 1e9:.3f} ms")


if __name__ == "__main__":
    main()
