"""The compressed backward as training calls it (``delta`` and a gate given), between
cudaProfilerStart/Stop for Nsight Compute, with the dK/dV kernel storing ``dS`` for the dQ or not
(``NSA_COMPRESSED_DQ_FROM_DS_MIB``), to see where the stores' cost goes::

    ncu --profile-from-start off --clock-control none -k regex:compressed_bwd_dkdv_kernel \\
        python scripts/ncu_compressed_bwd.py --length 16384 --ds on

bf16, B = 1, 64 query heads, 4 KV heads, head dim 128, paper defaults, random inputs; the call runs
once before profiling starts (compilation).
"""

from __future__ import annotations

import argparse
import os

import torch

from nsa.ops._triton.attention import attn_bwd_delta
from nsa.ops._triton.compressed_fwd import compressed_fwd
from nsa.ops.compressed import kernel
from ncu_range import compressed_inputs, profile_once


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--ds", choices=("on", "off"), default="on",
                        help="the dK/dV kernel stores dS for the dQ (on) or the dQ recomputes it (off)")
    args = parser.parse_args()
    os.environ["NSA_COMPRESSED_DQ_FROM_DS_MIB"] = str(1 << 20) if args.ds == "on" else "0"
    config, q, k_cmp, v_cmp, scale = compressed_inputs(args.length)
    o, lse, _ = compressed_fwd(q, k_cmp, v_cmp, config, scale, 0)
    do = torch.randn_like(o)
    gate = torch.rand(q.shape[:3], device="cuda")
    delta = attn_bwd_delta(o, do)
    profile_once([lambda: kernel.compressed_bwd(q, k_cmp, v_cmp, o, lse, do, None, config, scale, 0, delta=delta,
                                                gate=gate)])


if __name__ == "__main__":
    main()
