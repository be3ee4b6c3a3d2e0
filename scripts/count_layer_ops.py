"""How many PyTorch ops and Triton launches one eager step of an ``NSAAttention`` layer dispatches,
on the CPU (no GPU needed): a proxy for the host's work per step, which does not depend on the
machine's speed. The kernels run once through the Triton interpreter, then are stubbed out
(their outputs are not used for anything but shapes) while a dispatch mode counts every aten op.

Cases: ``decode`` (a one-token step on a static cache holding 256 tokens) and ``train`` (forward
and backward of 256 tokens). Small layer: hidden 256, 8 query heads, 2 KV heads, head dim 32.
On CPU tensors RoPE's rotation routes to the reference, which dispatches its own ops; a GPU runs
one Triton launch a rotation instead.

Usage: ``PYTHONPATH=src python scripts/count_layer_ops.py [decode|train]`` (run it with another
checkout's ``src`` to compare two versions).
"""

from __future__ import annotations

import collections
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
os.environ["NSA_CHECK_INDICES"] = "off"  # the stubbed kernels leave garbage indices

import torch  # noqa: E402
import triton.runtime.interpreter as interpreter  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from nsa import NSAAttention  # noqa: E402

#: ops that only make views: no kernel on a GPU
VIEWS = {"aten.view", "aten.unsqueeze", "aten.expand", "aten.slice", "aten.select", "aten.t", "aten.transpose",
         "aten._unsafe_view", "aten.split_with_sizes", "aten.unflatten", "aten.as_strided", "aten.alias", "aten.split",
         "aten.squeeze", "aten.detach", "aten.flatten", "aten.reshape", "aten.permute"}  # fmt: skip


class CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def main() -> None:
    case = sys.argv[1] if len(sys.argv) > 1 else "decode"
    torch.manual_seed(0)
    layer = NSAAttention(256, 8, 2, 32, backend="triton")
    if case == "decode":
        cache = layer.new_cache(1, capacity=272, static=True)
        token = torch.randn(1, 1, 256)
        with torch.no_grad():
            layer(torch.randn(1, 256, 256), cache)

        def step():
            with torch.no_grad():
                layer(token, cache)
    elif case == "train":
        x = torch.randn(1, 256, 256, requires_grad=True)

        def step():
            layer(x).sum().backward()
    else:
        raise SystemExit(f"unknown case {case!r}: decode or train")
    step()  # the real kernels once (interpreter)
    launches: collections.Counter = collections.Counter()
    interpreter.InterpretedFunction.run = lambda self, *a, **k: launches.update([self.fn.__name__])
    with CountOps() as counted:
        step()
    compute = {name: n for name, n in counted.ops.items() if name not in VIEWS}
    print(f"{case}: {sum(counted.ops.values())} aten ops, {sum(compute.values())} not views, "
          f"{sum(launches.values())} Triton launches")  # fmt: skip
    print(", ".join(f"{name} {n}" for name, n in sorted(compute.items(), key=lambda item: -item[1])))


if __name__ == "__main__":
    main()
