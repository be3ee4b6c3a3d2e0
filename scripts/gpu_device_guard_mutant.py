"""The two-GPU test's claim checked against a mutant: with the ops' device guard removed
(``nsa.ops._dispatch.cuda_device_of`` answering None), does a layer on ``cuda:1`` while
``cuda:0`` is current still equal the same layer on ``cuda:0``? Prints, for the guarded code and
the mutant, whether forward and gradients are equal or the error raised.

Usage (two GPUs): ``python scripts/gpu_device_guard_mutant.py``.
"""

from __future__ import annotations

import torch

import nsa.ops._dispatch as dispatch
from nsa import NSAAttention, NSAConfig

SMALL = NSAConfig(cmp_block=8, cmp_stride=4, sel_block=8, sel_count=4, window=16)  # tests/test_module.py's


def run(device: str):
    torch.manual_seed(0)
    layer = NSAAttention(24, 4, 2, 8, 6, SMALL).to(device=device, dtype=torch.bfloat16)
    x = torch.randn(1, 300, 24, generator=torch.Generator().manual_seed(1)).to(device, torch.bfloat16)
    x.requires_grad_()
    y = layer(x)
    grads = torch.autograd.grad(y.float().square().mean(), [x, *layer.parameters()])
    torch.cuda.synchronize(device)
    return [t.cpu() for t in (y, *grads)]


def main() -> None:
    guard = dispatch.cuda_device_of
    for name, finder in (("guarded", guard), ("mutant (no guard)", lambda *values: None)):
        dispatch.cuda_device_of = finder
        torch.cuda.set_device(0)
        try:
            same = all(torch.equal(a, b) for a, b in zip(run("cuda:0"), run("cuda:1")))
            print(f"{name}: cuda:1 equals cuda:0: {same}")
        except Exception as exc:  # noqa: BLE001 - the mutant's failure is the finding
            print(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    dispatch.cuda_device_of = guard


if __name__ == "__main__":
    main()
