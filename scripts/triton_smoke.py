"""Compile and run one tiny Triton kernel on the GPU and print the versions in use: the first
line of a GPU call that runs another Triton than the machine's (scripts/gpu_session33.sh)."""

import importlib.metadata as metadata

import torch
import triton
import triton.language as tl


@triton.jit
def _twice(x, y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y + offs, tl.load(x + offs, mask=offs < n) * 2, mask=offs < n)


if __name__ == "__main__":
    x = torch.randn(1000, device="cuda")
    y = torch.full_like(x, float("nan"))
    _twice[(4,)](x, y, 1000, BLOCK=256)
    assert torch.equal(y, 2 * x), "the smoke kernel computed a wrong result"
    print(f"triton {triton.__version__} (metadata {metadata.version('triton')}) from {triton.__file__}; "
          f"torch {torch.__version__}")
