"""Each op's float32 Triton output and gradients against the float64 reference, per ``tl.dot``
precision: which kernel, if any, goes wrong on tensor cores.

Why: session 26's GPU suite with ``NSA_FLOAT32_DOT=tf32x3`` found ``nsa_attention``'s dq wrong
(relative error 1.4) at head dim 128, while every float32 test at small head dims passed. This
runs the three branch ops and the whole op apart, at head dim 128 and 192/128, with and without the
dQ-from-dS buffers, and prints the relative error of every output.

Usage: ``python scripts/gpu_float32_check.py [--precisions tf32x3 tf32] [--dims 128:128 192:128]``.
"""

from __future__ import annotations

import argparse
import os
from typing import Callable, Dict, List

import torch

from nsa import NSAConfig, nsa_attention
from nsa.ops import compressed_attention, mean_compress, select_blocks, selected_attention, sliding_window_attention
from nsa.testing import rel_error

CONFIG = NSAConfig(window=128)


def grads(fn: Callable, inputs: List[torch.Tensor]) -> List[torch.Tensor]:
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    outs = fn(*leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    gen = torch.Generator(device=leaves[0].device).manual_seed(1)
    total = sum((o.double() * torch.randn(o.shape, generator=gen, device=o.device, dtype=torch.float64)).sum()
                for o in outs if o.is_floating_point())
    total.backward()
    return [o.detach() for o in outs if o.is_floating_point()] + [x.grad for x in leaves]


def check(name: str, fn: Callable, inputs: List[torch.Tensor]) -> str:
    try:
        got = grads(lambda *a: fn(*a, backend="triton"), inputs)
    except Exception as err:  # noqa: BLE001 - a launch that fails is a finding; the others still run
        return f"| {name} | {type(err).__name__}: {str(err)[:100]} |"
    want = grads(lambda *a: fn(*a, backend="reference"), [x.double() for x in inputs])
    errs = ", ".join(f"{rel_error(g, w):.1e}" for g, w in zip(got, want))
    return f"| {name} | {errs} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precisions", nargs="+", default=["tf32x3", "tf32"])
    parser.add_argument("--dims", nargs="+", default=["128:128", "192:128"])
    parser.add_argument("--T", type=int, default=600)
    args = parser.parse_args()
    dev = "cuda"
    print(f"{torch.cuda.get_device_name()}; T = {args.T}, 16 query heads, 1 KV head, window 128\n")
    for prec in args.precisions:
        os.environ["NSA_FLOAT32_DOT"] = prec
        for dims in args.dims:
            dk, dv = (int(x) for x in dims.split(":"))
            torch.manual_seed(0)
            T, HQ, H = args.T, 16, 1
            q = torch.randn(1, T, HQ, dk, device=dev)
            k = torch.randn(1, T, H, dk, device=dev)
            v = torch.randn(1, T, H, dv, device=dev)
            gates = torch.rand(1, T, HQ, 3, device=dev)
            k_cmp, v_cmp = mean_compress(k, CONFIG), mean_compress(v, CONFIG)
            block_idx = select_blocks(q.double(), k_cmp.double(), CONFIG, backend="reference")
            print(f"\n{prec}, Dk:Dv {dims}: relative errors of the outputs, then of each input's gradient\n")
            print("| op | errors |\n|---|---|")
            cases: Dict[str, tuple] = {
                "compressed (o, lse; dq, dk_cmp, dv_cmp)": (
                    lambda q_, k_, v_, backend: compressed_attention(q_, k_, v_, CONFIG, backend=backend),
                    [q, k_cmp, v_cmp]),
                "selected (o; dq, dk, dv)": (
                    lambda q_, k_, v_, backend: selected_attention(q_, k_, v_, block_idx, CONFIG, backend=backend),
                    [q, k, v]),
                "window (o; dq, dk, dv)": (
                    lambda q_, k_, v_, backend: sliding_window_attention(q_, k_, v_, CONFIG, backend=backend),
                    [q, k, v]),
                "nsa_attention (o; dq, dk, dv, dgates)": (
                    lambda q_, k_, v_, g_, backend: nsa_attention(q_, k_, v_, g_, CONFIG, backend=backend),
                    [q, k, v, gates]),
            }
            for name, (fn, inputs) in cases.items():
                print(check(name, fn, inputs), flush=True)
            for flag in ("NSA_SELECTED_DQ_FROM_DS_MIB", "NSA_COMPRESSED_DQ_FROM_DS_MIB", "NSA_FORCED_IN_WINDOW"):
                os.environ[flag] = "0"
                fn, inputs = cases["nsa_attention (o; dq, dk, dv, dgates)"]
                print(check(f"nsa_attention, {flag}=0", fn, inputs), flush=True)
                del os.environ[flag]


if __name__ == "__main__":
    main()
