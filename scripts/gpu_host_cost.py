"""What one NSA call costs the host, against what it costs the device.

A call is host-bound when the host takes longer to submit its launches than the device takes to
run them: queued calls then run at the host's pace, and the GPU idles between kernels. This
script measures both sides of each call, and where the host's time goes.

For each case and length, ``rounds`` calls, each submitted behind a device-side wait
(``torch.cuda._sleep``) long enough that the host never waits for the device, the L2 flushed
(``gpu_prefill_probe.timed``):

- **host ms**: ``perf_counter`` around the call (submission; nothing synchronised);
- **device ms**: CUDA events around the call on the stream: the device's time with every launch
  already queued, so the host's pace does not enter it;
- **queued ms**: ``do_bench`` (calls back to back): the larger of the two, roughly, as a
  training or serving loop sees it.

A host time near the wait's length means the call synchronised with the device (flagged).
``--profile-dir`` writes a ``cProfile`` of each case at ``--profile-length`` (functions by own
time and by cumulative time) to that folder.

Cases: ``attention`` (``nsa_attention``, no gradient), ``attention_train`` (forward and
backward), ``dense`` and ``dense_train`` (SDPA, cuDNN, the same shapes), ``layer`` and
``layer_train`` (``NSAAttention``, hidden 2048), ``decode`` (the layer's eager one-token step on
a static cache holding T tokens), ``rotary`` (``apply_rotary`` of the 64 query heads).

Usage: ``python scripts/gpu_host_cost.py [--lengths 1024,4096,16384] [--cases ...]
[--profile-dir DIR] [--profile-length 4096]``; prints markdown.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
from pathlib import Path
from typing import Callable, Dict

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import nsa
from gpu_prefill_probe import cycles_per_ms, timed  # scripts/ is on the path as the session scripts run it
from nsa import NSAAttention, NSAConfig

HQ, H, D, HIDDEN = 64, 4, 128, 2048
WAIT_MS = 40.0  # longer than any host submission measured here; a call that reaches it synchronised
CASES = ("attention", "attention_train", "dense", "dense_train", "layer", "layer_train", "decode", "rotary")


def profiled(fn: Callable[[], object], calls: int, cpms: float) -> str:
    """cProfile of ``calls`` calls behind device waits: the 30 functions with most own time,
    then the 30 with most cumulative time."""
    prof = cProfile.Profile()
    for _ in range(calls):
        torch.cuda.synchronize()
        torch.cuda._sleep(int(WAIT_MS * cpms))
        prof.enable()
        fn()
        prof.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(30)
    return out.getvalue()


def build(case: str, T: int, dev: torch.device) -> Callable[[], object]:
    """The call of ``case`` at length ``T`` on fresh random inputs."""
    dt = torch.bfloat16
    config = NSAConfig()
    if case in ("attention", "attention_train", "dense", "dense_train"):
        train = case.endswith("_train")
        q = torch.randn(1, T, HQ, D, device=dev, dtype=dt, requires_grad=train)
        k = torch.randn(1, T, H, D, device=dev, dtype=dt, requires_grad=train)
        v = torch.randn(1, T, H, D, device=dev, dtype=dt, requires_grad=train)
        gates = torch.rand(1, T, HQ, 3, device=dev, dtype=dt, requires_grad=train)
        do = torch.randn(1, T, HQ, D, device=dev, dtype=dt)
        if case.startswith("dense"):
            qt, kt, vt, dot = (t.detach().transpose(1, 2).requires_grad_(train) for t in (q, k, v, do))

            def fwd():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(qt, kt.repeat_interleave(HQ // H, 1),
                                                          vt.repeat_interleave(HQ // H, 1), is_causal=True)

            if not train:
                return lambda: fwd()
            return lambda: fwd().backward(dot)
        if not train:
            def infer():
                with torch.no_grad():
                    return nsa.nsa_attention(q, k, v, gates, config)

            return infer
        return lambda: nsa.nsa_attention(q, k, v, gates, config).backward(do)
    if case == "rotary":
        from nsa.modules.rotary import RotaryEmbedding

        x = torch.randn(1, T, HQ, D, device=dev, dtype=dt)
        cos, sin = RotaryEmbedding(D).tables(torch.arange(T, device=dev), dt)
        return lambda: nsa.ops.apply_rotary(x, cos, sin)
    layer = NSAAttention(HIDDEN, HQ, H, D, config=config).to(device=dev, dtype=dt)
    if case in ("layer", "layer_train"):
        train = case == "layer_train"
        x = torch.randn(1, T, HIDDEN, device=dev, dtype=dt, requires_grad=train)
        if not train:
            def layer_infer():
                with torch.no_grad():
                    return layer(x)

            return layer_infer
        dy = torch.randn(1, T, HIDDEN, device=dev, dtype=dt)
        return lambda: layer(x).backward(dy)
    if case == "decode":
        steps = 4000  # capacity for every call of the case: warm-up, rounds and the profile
        cache = layer.new_cache(1, capacity=T + steps, static=True)
        with torch.no_grad():
            layer(torch.randn(1, T, HIDDEN, device=dev, dtype=dt), cache)
        token = torch.randn(1, 1, HIDDEN, device=dev, dtype=dt)

        def step():
            with torch.no_grad():
                return layer(token, cache)

        return step
    raise ValueError(f"unknown case {case!r}; cases: {', '.join(CASES)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="1024,4096,16384")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--profile-dir", type=Path, default=None)
    parser.add_argument("--profile-length", type=int, default=4096)
    args = parser.parse_args()
    from triton.testing import do_bench

    dev = torch.device("cuda")
    torch.manual_seed(0)
    cpms = cycles_per_ms()
    print(f"device: {torch.cuda.get_device_name(dev)}, torch {torch.__version__}, "
          f"triton {__import__('triton').__version__}; bf16, HQ {HQ}, H {H}, D {D}, hidden {HIDDEN}\n")  # fmt: skip
    print("| case | T | host ms | device ms | host / device | queued ms (do_bench) | note |")
    print("|---|---:|---:|---:|---:|---:|---|")
    profiles: Dict[str, str] = {}
    for case in args.cases.split(","):
        for T in (int(t) for t in args.lengths.split(",")):
            fn = build(case, T, dev)
            for _ in range(3):  # compile and autotune outside the samples
                fn()
            torch.cuda.synchronize()
            device, host = timed(fn, args.rounds, WAIT_MS, cpms)  # behind a device wait, L2 flushed
            queued = do_bench(fn, warmup=3, rep=60, return_mode="median")
            note = "synchronised with the device" if host > 0.8 * WAIT_MS else ""
            print(f"| {case} | {T} | {host:.3f} | {device:.3f} | {host / device:.2f} | {queued:.3f} | {note} |",
                  flush=True)  # fmt: skip
            if args.profile_dir is not None and T == args.profile_length:
                profiles[case] = profiled(fn, 20, cpms)
            del fn
            torch.cuda.empty_cache()
    if args.profile_dir is not None:
        args.profile_dir.mkdir(parents=True, exist_ok=True)
        for case, text in profiles.items():
            (args.profile_dir / f"host_profile_{case}_{args.profile_length}.txt").write_text(text)
        print(f"\nprofiles ({len(profiles)}) in {args.profile_dir}")


if __name__ == "__main__":
    main()
