"""Check and time the selected-attention and sliding-window Triton kernels on one GPU.

Run on the GPU machine (``PYTHONPATH=src python scripts/gpu_selected_window.py``):

1. correctness at real sizes: bfloat16 kernels against the float32 reference
   functions of ``nsa.ops.<op>.reference`` (forward and every gradient), plus a
   bitwise determinism check of the backward;
2. timings (``triton.testing.do_bench`` medians, ms) of the public ops and of
   launch variants, with dense SDPA (flash and cuDNN backends) as the baseline.

Shapes follow the prefill target: B = 1, 64 query heads, 4 KV heads, head dim
128, paper defaults (sel_block 64, 16 blocks, window 512). Block lists look like
``select_blocks`` output (initial + two local blocks forced, the rest random
among the visible ones, ascending, -1 padded). A compact table is printed last;
``--out DIR`` also writes it as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend
import triton
from triton.testing import do_bench

from nsa import NSAConfig
from nsa.ops import selected_attention, sliding_window_attention
from nsa.ops._triton.attention import attn_bwd_delta
from nsa.ops.selected import kernel as sel_kernel
from nsa.ops.selected import reference as sel_ref
from nsa.ops.window import kernel as win_kernel
from nsa.ops.window import reference as win_ref
from nsa.testing import rel_error

CFG = NSAConfig()
ROWS = []  # (name, T, ms) of every timing


def select_like_blocks(B, T, H, config, device, chunk=4096):
    """int32 ``[B, T, H, n]``: forced initial/local blocks plus random visible ones, ascending, -1 last."""
    n, bs = config.sel_count, config.sel_block
    nb = triton.cdiv(T, bs)
    out = torch.empty(B, T, H, n, device=device, dtype=torch.int32)
    j = torch.arange(nb, device=device)
    for c0 in range(0, T, chunk):
        tb = (torch.arange(c0, min(T, c0 + chunk), device=device) // bs)[None, :, None, None]
        score = torch.rand(B, tb.shape[1], H, nb, device=device)
        score = torch.where((j == 0) | (j == tb) | (j == tb - 1), 2.0, score)
        score = score.masked_fill(j > tb, float("-inf"))
        val, idx = score.topk(min(n, nb), dim=-1)
        idx = torch.where(val == float("-inf"), nb, idx).sort(-1).values  # empties sort last
        idx = torch.where(idx == nb, -1, idx).to(torch.int32)
        out[:, c0 : c0 + chunk] = F.pad(idx, (0, n - idx.shape[-1]), value=-1)
    return out


def inputs(T, HQ=64, H=4, DK=128, DV=128, dtype=torch.bfloat16):
    q = torch.randn(1, T, HQ, DK, device="cuda", dtype=dtype)
    k = torch.randn(1, T, H, DK, device="cuda", dtype=dtype)
    v = torch.randn(1, T, H, DV, device="cuda", dtype=dtype)
    return q, k, v


def grads(fn, q, k, v, do):
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    o = fn(q, k, v)
    o.backward(do.to(o.dtype))
    return o, q.grad, k.grad, v.grad


def check(name, fn_kernel, fn_ref, q, k, v):
    do = torch.randn(*q.shape[:3], v.shape[-1], device="cuda", dtype=torch.float32)
    out = grads(fn_kernel, q, k, v, do)
    again = grads(fn_kernel, q, k, v, do)
    ref = grads(fn_ref, q.float(), k.float(), v.float(), do)
    errs = [rel_error(a, b) for a, b in zip(out, ref)]
    same = all(torch.equal(a, b) for a, b in zip(out, again))
    ok = max(errs) <= 1e-2 and same
    print(f"check {name:38s} o {errs[0]:.2e} dq {errs[1]:.2e} dk {errs[2]:.2e} dv {errs[3]:.2e} "
          f"deterministic={same} {'OK' if ok else 'FAIL'}", flush=True)
    return ok


def correctness():
    ok = True
    for T, HQ, H, DK, DV in [(4099, 64, 4, 128, 128), (3001, 16, 16, 128, 128), (2053, 16, 1, 192, 128)]:
        q, k, v = inputs(T, HQ, H, DK, DV)
        idx = select_like_blocks(1, T, H, CFG, "cuda")
        scale = DK ** -0.5
        tag = f"T{T}-HQ{HQ}-H{H}-DK{DK}-DV{DV}"
        ok &= check(f"window {tag}", lambda a, b, c: sliding_window_attention(a, b, c, CFG, backend="triton"),
                    lambda a, b, c: win_ref.sliding_window_attention(a, b, c, CFG, scale, 0), q, k, v)
        ok &= check(f"selected {tag}", lambda a, b, c: selected_attention(a, b, c, idx, CFG, backend="triton"),
                    lambda a, b, c: sel_ref.selected_attention(a, b, c, idx, CFG, scale, 0), q, k, v)
        rnd = torch.randint(-1, triton.cdiv(T, 64), (1, T, H, 16), device="cuda", dtype=torch.int32)
        ok &= check(f"selected random-order {tag}", lambda a, b, c: selected_attention(a, b, c, rnd, CFG, backend="triton"),
                    lambda a, b, c: sel_ref.selected_attention(a, b, c, rnd, CFG, scale, 0), q, k, v)
    return ok


def bench(name, T, fn):
    ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
    ROWS.append((name, T, ms))
    print(f"time {name:44s} T={T:6d} {ms:9.3f} ms", flush=True)
    return ms


def fwd_bwd(fn, q, k, v, do):
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))

    def run():
        for x in (q, k, v):
            x.grad = None
        fn(q, k, v).backward(do)

    return run


def timings(lengths, variants):
    for T in lengths:
        q, k, v = inputs(T)
        idx = select_like_blocks(1, T, 4, CFG, "cuda")
        do = torch.randn(1, T, 64, 128, device="cuda", dtype=torch.bfloat16)
        win = lambda a, b, c: sliding_window_attention(a, b, c, CFG, backend="triton")
        sel = lambda a, b, c: selected_attention(a, b, c, idx, CFG, backend="triton")
        bench("window fwd", T, lambda: win(q, k, v))
        bench("window fwd+bwd", T, fwd_bwd(win, q, k, v, do))
        bench("selected fwd", T, lambda: sel(q, k, v))
        bench("selected fwd+bwd", T, fwd_bwd(sel, q, k, v, do))
        qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))
        backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
        for tag, backend in backends.items():
            if T > 16384 and tag == "flash":  # PERF_NOTES has it (201 ms); cuDNN is the faster baseline
                continue
            with torch.nn.attention.sdpa_kernel(backend):
                dense = lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True, enable_gqa=True)
                bench(f"dense SDPA {tag} fwd", T, lambda: dense(qh, kh, vh))
                if T <= 16384:  # 64k: PERF_NOTES has it (445 ms cuDNN), too slow to repeat here
                    dht = do.transpose(1, 2)
                    bench(f"dense SDPA {tag} fwd+bwd", T, fwd_bwd(dense, qh, kh, vh, dht))
        if variants:
            launch_variants(T, q, k, v, idx, do)


def launch_variants(T, q, k, v, idx, do):
    """Each kernel alone, defaults first; the selected kernels with and without the
    tile-shared forced blocks (paper: 1 initial + 2 local)."""
    scale = q.shape[-1] ** -0.5
    sel, win = sel_kernel, win_kernel
    for forced in [(1, 2), (0, 0)]:
        for tiles in [{}, dict(num_warps=4)]:
            bench(f"selected fwd forced={forced} {tiles}", T, lambda: sel.selected_fwd(q, k, v, idx, 64, scale, 0, tiles, forced))
    o, lse = sel.selected_fwd(q, k, v, idx, 64, scale, 0, forced=(1, 2))
    delta = attn_bwd_delta(o, do)
    bench("attn_bwd_delta", T, lambda: attn_bwd_delta(o, do))
    args = (q, k, v, idx, do, lse, delta, 64, scale, 0)
    for forced in [(1, 2), (0, 0)]:
        bench(f"selected dq forced={forced}", T, lambda: sel.selected_bwd_dq(*args, sel.BWD_TILES["dq"], forced))
    bench("selected invert_selection", T, lambda: sel.invert_selection(idx, 64, 0, T // 64, 1024))
    bench("selected dkdv+invert", T, lambda: sel.selected_bwd_dkdv(*args, sel.BWD_TILES["dkdv"]))
    bench("window fwd", T, lambda: win.window_fwd(q, k, v, 512, scale, 0))
    o, lse = win.window_fwd(q, k, v, 512, scale, 0)
    delta = attn_bwd_delta(o, do)
    for kind, launch in (("dq", win.window_bwd_dq), ("dkdv", win.window_bwd_dkdv)):
        cfg = win._bwd_cfg(kind, 16, 128, 128, None, q.dtype, q.device)
        bench(f"window {kind}", T, lambda: launch(q, k, v, do, lse, delta, 512, scale, 0, cfg))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", default="8192,65536")
    parser.add_argument("--variants", default="65536", help="lengths at which launch variants are timed")
    parser.add_argument("--skip-check", action="store_true")
    parser.add_argument("--out", default=os.environ.get("OUT"))
    args = parser.parse_args()
    print(f"device {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__} "
          f"date {time.strftime('%Y-%m-%d')}", flush=True)
    ok = True if args.skip_check else correctness()
    variants = {int(x) for x in args.variants.split(",") if x}
    for T in (int(x) for x in args.lengths.split(",")):
        timings([T], T in variants)
    print("\n| op | T | ms |\n|---|---|---|")
    for name, T, ms in ROWS:
        print(f"| {name} | {T} | {ms:.3f} |")
    if args.out:
        with open(os.path.join(args.out, "selected_window.json"), "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                           correct=bool(ok), rows=ROWS), f, indent=1)
    print("correctness", "OK" if ok else "FAIL")


if __name__ == "__main__":
    main()
