"""The compressed forward three ways between cudaProfilerStart/Stop, for Nsight Compute: ``o`` and
``lse`` only (pass 1), block masses only (pass 1 without ``p @ v``, then pass 2), and both (the
training and inference launch)::

    ncu --profile-from-start off --clock-control none -k regex:compressed_fwd_kernel --set full \
        python scripts/ncu_compressed_fwd.py --length 16384

bf16, B = 1, 64 query heads, 4 KV heads, head dim 128, paper defaults, random inputs; the calls run
once before profiling starts (compilation).
"""

from __future__ import annotations

import argparse

from nsa.ops._triton import compressed_fwd as current
from ncu_range import compressed_inputs, profile_once

#: (store_o, select) of the three launches, in the order they are profiled
MODES = ((True, False), (False, True), (True, True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--module", default="", help="a saved copy of the kernel's module to profile instead")
    args = parser.parse_args()
    module = current
    if args.module:
        import importlib.util

        spec = importlib.util.spec_from_file_location("saved_compressed_fwd", args.module)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    config, q, k_cmp, v_cmp, scale = compressed_inputs(args.length)
    calls = [lambda o=o, s=s: module.compressed_fwd(q, k_cmp, v_cmp, config, scale, 0, store_o=o, select=s) for o, s in MODES]
    profile_once(calls)


if __name__ == "__main__":
    main()
