"""Where a compiled ``NSAAttention`` spends its time against the eager layer: the strides of the
tensors that reach NSA's ops, and the CUDA kernels by total time (``torch.profiler``), eager and
compiled (``fullgraph=True``), for a forward (inference) and a forward+backward.

Usage: ``python scripts/gpu_compile_profile.py [--length 16384] [--top 12]``; prints markdown (bf16,
hidden 2048, HQ 64, H 4, D 128).
"""

from __future__ import annotations

import argparse
from typing import Callable, Dict, List

import torch
from torch.profiler import ProfilerActivity, profile

import nsa.ops.combine as combine
from nsa import NSAAttention, NSAConfig

STRIDES: List[Dict[str, tuple]] = []


def record_strides() -> None:
    """Keep the strides of the tensors of every ``nsa_attention`` call that runs eagerly in
    :data:`STRIDES`: the layer's own eager calls and, compiled, the custom op's implementation
    (which calls ``nsa.ops.combine.nsa_attention``); nothing while Dynamo traces."""
    import nsa.modules.attention as attention

    op = combine.nsa_attention

    def recorded(q, k, v, gates, config, **kwargs):
        if torch.compiler.is_compiling():
            return op(q, k, v, gates, config, **kwargs)
        seen = dict(q=q, k=k, v=v, gates=gates)
        for name in ("kv_cmp", "kv_win"):
            if kwargs.get(name) is not None:
                seen.update({f"{name}[0]": kwargs[name][0], f"{name}[1]": kwargs[name][1]})
        STRIDES.append({name: (tuple(t.shape), t.stride()) for name, t in seen.items()})
        return op(q, k, v, gates, config, **kwargs)

    combine.nsa_attention = attention.nsa_attention = recorded


def kernels(fn: Callable[[], object], top: int) -> List[str]:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    rows = sorted((e for e in prof.key_averages() if e.device_time_total > 0), key=lambda e: -e.device_time_total)
    total = sum(e.device_time_total for e in rows) / 5e3
    out = [f"total {total:.3f} ms a call"]
    for e in rows[:top]:
        out.append(f"- {e.device_time_total / 5e3:8.3f} ms  x{e.count // 5:<3d} {e.key[:110]}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    torch.manual_seed(0)
    layer = NSAAttention(2048, 64, 4, 128, config=NSAConfig()).cuda().bfloat16()
    x = torch.randn(1, args.length, 2048, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}; bf16, T {args.length}\n")
    record_strides()
    compiled = torch.compile(layer, fullgraph=True)

    def infer(model):
        def run():
            with torch.no_grad():
                model(x)
        return run

    def train(model):
        def run():
            torch.autograd.grad(model(x).float().square().mean(), [x, *layer.parameters()])
        return run

    for name, model in (("eager", layer), ("compiled", compiled)):
        STRIDES.clear()
        infer(model)()
        print(f"## {name}: strides at nsa_attention (inference)\n")
        for call in STRIDES[:1]:
            for tensor, (shape, stride) in call.items():
                print(f"- {tensor}: shape {list(shape)} stride {stride}")
        for case, make in (("forward", infer), ("forward+backward", train)):
            print(f"\n## {name}, {case}\n")
            print("\n".join(kernels(make(model), args.top)), flush=True)
        print()


if __name__ == "__main__":
    main()
