"""Prefill probes on a GPU: what the host's launches add to a timing, and kernel variants.

Usage: ``python scripts/gpu_prefill_probe.py [--lengths 8192 65536] [--profile-host out.txt] [--only SECTION ...]``

1. **Launch gaps.** The whole ``nsa_attention`` (forward, forward+backward) and dense cuDNN
   timed three ways, L2 flushed each time: ``triton.testing.do_bench`` (calls queued back to
   back, the issue's method); each call from an idle device (synchronised first, the
   repository's eager method until session 7); each call submitted behind a device-side
   wait long enough for the host to enqueue all of it. Also the host's submission time
   of one call (``perf_counter`` around it, nothing synchronised).
2. **Selected attention.** Warps and stages of the forward and of the dQ (outputs
   compared bitwise with the defaults'), and each piece of the backward alone.
3. **Selection inversion.** The device kernels of the dK/dV query lists, by time.
4. **Compressed forward with selection, selected dK/dV, forced-block kernels** against saved
   copies of the previous code (``scripts/_old_<module>.py``, not committed), where present.
5. **Window tiles**: forward and dQ by (rows, key tile, warps, stages).
6. **Forced-block kernels** alone by (rows, warps, stages), and the selected forward without them.
7. **Inference gated sum**: window then gated sum, against the window kernel writing the sum.
8. **Compressed dK/dV tiles** (``cmp_dkdv``): the compressed backward by (rows, token tile, warps,
   stages, split cap), then the whole forward+backward with the fastest as the default.
9. **Selected dK/dV launches** (``sel_dkdv``): warps, stages, queries per step and per program.
10. **Kernel times** (``kernels``): every kernel of one forward+backward, from the torch profiler
    (the 16 longest; ``--kernels n`` lists n); ``fwd_kernels`` the same for one forward under
    ``no_grad``.
11. **Gated-sum bits** (``gated_bits``): the inference gated sum against the two launches, bit by bit.
12. **Training as one Function** (``training``): ``nsa_attention``'s training path against the
    ops' own autograd Functions composed, timed and compared.
13. **Gates inside the branch kernels** (``gate_ab``): training's forward and backward launches
    with the gates applied in the branch kernels against the stored ``g * do`` copies, piece by piece.
14. **Compressed backward** (``cmp_bwd``) against a saved copy of the previous kernels, and by the
    programs per SM that its dK/dV query chunks aim at.
15. **Compressed forward variants** (``cmp_fwd``): tiles and where the top-n runs, with each
    compiled variant's registers and shared memory.
16. **Top-n launches** (``topn``): rows per program and warps, on every query chunk.
17. **Selected tiles of several queries** (``sel_tiles``): the forward and dQ by query positions a
    program and warps, and one a program against the saved copy of the previous kernels.
18. **Compressed forward parts** (``cmp_parts``): pass 1 alone, selection alone, both.
19. **Descriptors** (``kv_desc``): the selected forward's and dQ's blocks by bulk copies or plain loads.
20. **dQ from dS** (``dq_ds``): the selected dQ from the dK/dV kernel's ``dS`` against recomputing its
    softmax, by warps and loads, each kernel alone and in the whole forward+backward.
21. **The window beside the compressed pass** (``win_beside``), on a second stream.
22. **The window beside the selected forward** (``win_slc_pipe``): both by query chunks, the
    window's on a second stream, each chunk's selected launch waiting for its own window launch.
23. **Compressed dK/dV tiles with dS** (``cmp_dkdv_ds``): the compressed backward as training calls
    it where the ``dS`` buffer fits, by the dK/dV kernel's tiles and query chunks.
24. **The window's dK/dV tiles** (``win_dkdv``): training's launch by query rows and stages, alone
    and in the whole forward+backward; ``win_dkdv_kernels`` the kernel list with each of two tiles,
    ``win_dkdv_step`` the whole step with each, L2 flushed or not.
25. **The top-n's bounded rounds** (``topn_bounds``): the forward and the whole step in ABBA
    rounds, and the forward's kernel lists, with the radix select's rounds bounded or all 31.
26. **Pass 2 apart** (``pass2_apart``): the compressed forward with its scoring pass in launches of
    its own, by their tiles, checked against the fused launch; the fastest in the whole forward and
    forward+backward (ABBA) and in the forward's kernel lists. ``pass2_tiles``: more of its tiles;
    ``pass2_wide``: wider query tiles, and the default against the fused launch as ``pass2_apart``;
    ``pass1_tiles``: pass 1's tiles where pass 2 runs apart.
27. **Where the forced blocks go** (``forced_place``): the ``NSA_FORCED_IN_WINDOW`` flag on and off,
    the whole forward and forward+backward (ABBA) and the forward's kernel lists.
28. **The compressed dQ from dS by its launch** (``dq_ds_tiles``): tokens a step, warps, stages and
    query tiles a program, in the compressed backward and its kernel lists; the fastest against the
    default in the whole forward+backward (ABBA) and its kernels.
29. **Pass 1 in 128-row tiles** (``pass1_wide``): pass 1 of the compressed forward (where pass 2
    runs apart) in tiles of 8 query positions at two programs an SM, against the default; the
    fastest in the whole forward and forward+backward (ABBA) and the forward's kernel lists.
30. **Pass 1's whole tiles through tensor descriptors** (``pass1_desc``): pass 1 with
    ``PASS2_APART["pass1"]["kv_desc"]`` off and on (on by default since session 59), checked
    bitwise against the fused launch, then in the whole forward and forward+backward (ABBA) and
    the forward's kernel lists.
31. **Pass 1 without serialised products** (``pass1_serial``): pass 1 in launches whose wgmma
    ptxas does not serialise (the default's it does, for want of registers), as ``pass1_wide``.
32. **Pass 1's rate** (``pass1_rate``): pass 1 alone where pass 2 runs apart, from the profiler, in
    TFLOP/s of useful work.
33. **The compressed dK/dV in Gluon** (``gluon_dkdv``): ``NSA_GLUON_COMPRESSED_DKDV`` off and on,
    the whole forward+backward (ABBA) and its kernel lists.
34. **Versions of the Gluon dK/dV** (``gluon_dkdv_variants``): other files of
    ``nsa/ops/compressed/gluon_dkdv.py`` (``--dkdv-variant LABEL=FILE``, e.g. a branch's, exported)
    in place of main's: each one's gradients against main's, then the whole forward+backward
    (ABBA) and its kernel lists, all in one process.
35. **The selected dK/dV in Gluon** (``gluon_selected_dkdv``): ``NSA_GLUON_SELECTED_DKDV`` off and on,
    as ``gluon_dkdv``; its queries a program (``gluon_selected_qseg``). ``gluon_dkdv_variants`` takes
    the selected branch's module with ``--dkdv-branch selected``.
36. **The window dK/dV in Gluon** (``gluon_window_dkdv``): ``NSA_GLUON_WINDOW_DKDV`` off and on, as
    ``gluon_dkdv``. ``gluon_dkdv_variants`` takes the window's modules with ``--dkdv-branch window``,
    its dQ's and forward's with ``--variant-module gluon_dq`` or ``gluon_fwd`` too, and the compressed
    forward's pass 1 with ``--variant-module gluon_pass1``.
37. **The compressed forward's pass 1 in Gluon** (``gluon_pass1``): ``NSA_GLUON_COMPRESSED_PASS1`` off
    and on, the forward and the forward+backward (ABBA) and the forward's kernel lists.
38. **The window dQ in Gluon** (``gluon_window_dq``): ``NSA_GLUON_WINDOW_DQ`` off and on, as
    ``gluon_dkdv``.
39. **The window forward in Gluon** (``gluon_window_fwd``): ``NSA_GLUON_WINDOW_FWD`` off and on, as
    ``gluon_pass1``.
40. **The compressed forward's scoring pass in Gluon** (``gluon_scores``): ``NSA_GLUON_COMPRESSED_SCORES``
    off and on, as ``gluon_pass1``.
41. **The selected forward's programs an SM** (``sel_regs``): the selected forward as the inference path
    runs it (from the window launch's forced-block result, writing the gated sum) by pipeline stages and
    registers a thread (``maxnreg``), so that more one-warp programs fit an SM; each checked bitwise
    against the default, two rounds; the fastest, where it beats the default in both, in the whole
    forward (ABBA) and the forward's kernel lists.

42. **The window beside the selected forward, on parts of the GPU** (``win_slc_partition``): the window
    forward (Gluon, persistent) launched on ``P`` programs (so ``P`` SMs) and, on a second stream right
    after it, the selected forward with the gated sum from the window's earlier result (no dependency:
    a timing of the two side by side, the selected kernel's programs filling the SMs the window's
    shared memory leaves), against the two in turn on the whole GPU; each kernel alone at ``P`` too.
43. **The block masses' second plane** (``scores_planes``): each query chunk's scoring pass with its two
    planes and with the first alone, the top-n on both planes and on their sum, and on chunks twice as
    long.
44. **The top-n's whole-piece reads** (``topn_aligned``): against a saved copy of the kernel before
    (``scripts/_old_block_topn.py``), the same blocks, each chunk timed; then the forward's kernel lists.
45. **The score buffer's cap** (``score_budget``): the forward in ABBA rounds and its kernel lists with
    the compressed forward's block-score buffer capped at 256 MiB (the default), 512 MiB and 1 GiB.

Session 55's sections on the branches of its two dropped designs (each A/B of the whole step through
:func:`step_abba`, its kernel lists through :func:`kernels_by_default`): ``sel_order``,
``sel_order_kernels`` and ``sel_order_step`` on ``next/sel-order`` (the selected dK/dV's programs
launched by their segments' first queries); ``win_dq_ds``, ``win_dq_ds_kernels`` and
``win_dq_ds_step`` on ``next/window-dq-ds`` (the window's dQ from the dK/dV kernel's dS).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time
from contextlib import contextmanager, nullcontext
from types import SimpleNamespace
from typing import Callable, List, Optional, Tuple

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

from compiled_kernels import resources
from nsa import NSAConfig
from nsa.bench.timing import spin_cycles_per_s
from nsa.bench.workloads import Shape, prefill_inputs
from nsa.ops import mean_compress, nsa_attention, select_blocks
from nsa.ops._triton.compressed_fwd import PASS2_APART
from nsa.ops.selected.kernel import (
    BWD_TILES,
    _dkdv_queries_per_program,
    invert_selection,
    selected_bwd,
    selected_bwd_dkdv,
    selected_bwd_dq,
    selected_fwd,
)
from nsa.ops._triton.attention import LOG2E, attn_bwd_delta
from nsa.ops._triton.device import sm_count

DEV = torch.device("cuda")
D = 128  # the workload's head dim (Shape.default on a GPU: 64 query heads, 4 KV heads, bf16)
#: (warps, stages) tried for the selected forward and dQ; session 7 also measured (2, 2), (2, 3),
#: (4, 2), (4, 3), (1, 3) for the forward and (4, 2), (4, 3), (8, 2), (1, 2), (2, 3) for the dQ,
#: all slower than the defaults (1, 2) and (2, 2) (docs/perf/prefill.md)
FWD_SWEEP = ((1, 2), (1, 1), (2, 1))
DQ_SWEEP = ((2, 2), (2, 1), (4, 1))
#: (rows, warps, stages) of the forced-block kernels; session 7 also measured (128, 8, 2), (32, 2, 2),
#: (64, 4, 3) and (64, 8, 2), all slower than the default (64, 4, 2)
FORCED_SWEEP = ((64, 4, 2), (64, 4, 1), (128, 8, 1))
FLUSH = torch.empty(2 * 64 * 2**20 // 4, dtype=torch.int32, device=DEV)


def bench(fn: Callable[[], object]) -> float:
    return do_bench(fn, warmup=25, rep=1000, return_mode="median")


def cycles_per_ms() -> float:
    """``torch.cuda._sleep``'s cycles per ms on the current GPU (the library's calibration)."""
    return spin_cycles_per_s(torch.device("cuda")) / 1e3


def timed(fn: Callable[[], object], rounds: int, hide_ms: float, cpms: float) -> tuple:
    """Medians (device ms, host submission ms) of calls from an idle device (``hide_ms`` 0)
    or behind a device wait of ``hide_ms``."""
    dev, host = [], []
    for _ in range(rounds):
        torch.cuda.synchronize()
        if hide_ms:
            torch.cuda._sleep(int(hide_ms * cpms))
        FLUSH.zero_()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e3)
        e1.record()
        e1.synchronize()
        dev.append(e0.elapsed_time(e1))
    return statistics.median(dev), statistics.median(host)


def fwd_bwd(fn: Callable[[], torch.Tensor], inputs: List[torch.Tensor]) -> Callable[[], object]:
    grad = torch.randn_like(fn())
    return lambda: torch.autograd.grad(fn(), inputs, grad)


def forward_call(q, k, v, gates, config: NSAConfig) -> Callable[[], object]:
    """One ``nsa_attention`` forward (Triton) under ``no_grad`` on these inputs, as a call (what the
    tables' forward column times)."""
    def run():
        with torch.no_grad():
            return nsa_attention(q, k, v, gates, config, backend="triton")

    return run


def training_step(q, k, v, gates, config: NSAConfig) -> Callable[[], object]:
    """One ``nsa_attention`` forward+backward (Triton) on these inputs, as a call."""
    return fwd_bwd(lambda: nsa_attention(q, k, v, gates, config, backend="triton"), [q, k, v, gates])


@contextmanager
def tiles_as_default(table: dict, **tiles):
    """A module's launch table (``BWD_TILES["dkdv"]``, ``DKDV_TILES``, ...) with ``tiles`` over its
    entries while the block runs, as it was afterwards."""
    saved = dict(table)
    table.update(tiles)
    try:
        yield
    finally:
        table.clear()
        table.update(saved)


def inputs(T: int, seed: int, backward: bool = False) -> Tuple[torch.Tensor, ...]:
    """``(q, k, v, gates)`` of the workload at length ``T`` (and ``do`` with ``backward``), seeded."""
    torch.manual_seed(seed)
    return prefill_inputs("nsa", Shape.default(DEV, 1, T), DEV, backward)


def selected_case(T: int, config: NSAConfig, seed: int) -> SimpleNamespace:
    """The selected branch at length ``T``: inputs, the real selection, the forward's ``o``/``lse``,
    an output gradient ``do`` and ``delta = rowsum(o * do)``."""
    q, k, v, _ = inputs(T, seed)
    idx = select_blocks(q, mean_compress(k, config), config, backend="triton")
    scale, forced = config.softmax_scale(D), (config.init_blocks, config.local_blocks)
    o, lse = selected_fwd(q, k, v, idx, config.sel_block, scale, 0, forced=forced)
    do = torch.randn_like(o)
    return SimpleNamespace(T=T, q=q, k=k, v=v, idx=idx, scale=scale, forced=forced, o=o, lse=lse, do=do,
                           delta=attn_bwd_delta(o, do))


#: constexprs of the forced-block dQ kernel beyond the forward's: a fresh dq, no gate
DQ_META = dict(ACC=False, GATED=False)


def forced_kernel_args(c: SimpleNamespace, o: torch.Tensor, lse: torch.Tensor, dq: torch.Tensor) -> Tuple[tuple, tuple]:
    """Arguments of the forced-block forward (writing ``o``/``lse``) and dQ (writing ``dq``, no gate:
    launch it with ``DQ_META``) kernels."""
    strides = (*c.q.stride()[:3], *c.k.stride()[:3], *c.v.stride()[:3])
    fargs = (c.q, c.k, c.v, c.idx, o, lse, *strides, c.T, 0, c.scale * LOG2E)
    dargs = (c.q, c.k, c.v, c.idx, c.do, c.do, c.lse, c.delta, dq, *strides, *c.do.stride()[:3], c.T, 0,
             c.scale * LOG2E, c.scale)
    return fargs, dargs


def launch_gaps(T: int, config: NSAConfig, cpms: float, profile_path: str) -> None:
    q, k, v, gates, _ = inputs(T, T, backward=True)

    def nsa_fwd():
        with torch.no_grad():
            return nsa_attention(q, k, v, gates, config)

    def dense_call():
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=True, enable_gqa=True)

    def dense_fwd():
        with torch.no_grad():
            return dense_call()

    cases = {
        "nsa fwd": nsa_fwd,
        "nsa fwd+bwd": fwd_bwd(lambda: nsa_attention(q, k, v, gates, config), [q, k, v, gates]),
        "dense cudnn fwd": dense_fwd,
        "dense cudnn fwd+bwd": fwd_bwd(dense_call, [q, k, v]),
    }
    rounds = 30 if T <= 16384 else 8
    for name, fn in cases.items():
        fn()
        queued = bench(fn)
        idle, host = timed(fn, rounds, 0.0, cpms)
        hidden, host2 = timed(fn, rounds, max(2.0, 3 * host + 1.0), cpms)
        print(f"T={T} {name}: do_bench {queued:.3f} ms | idle device {idle:.3f} | behind a wait {hidden:.3f} | "
              f"host submission {host:.3f} / {host2:.3f} ms", flush=True)
    if profile_path and T == 8192:
        prof = cProfile.Profile()
        torch.cuda.synchronize()
        prof.enable()
        for _ in range(20):
            cases["nsa fwd+bwd"]()
        prof.disable()
        torch.cuda.synchronize()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(40)
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(60)
        with open(profile_path, "w") as f:
            f.write(out.getvalue())


def selected_variants(T: int, config: NSAConfig) -> None:
    """Launch shapes of the selected forward and dQ, and the backward's pieces alone."""
    c = selected_case(T, config, T + 1)
    q, k, v, idx, scale, forced, o, lse, do, delta = c.q, c.k, c.v, c.idx, c.scale, c.forced, c.o, c.lse, c.do, c.delta
    want_dq = selected_bwd_dq(q, k, v, idx, do, lse, delta, config.sel_block, scale, 0, dict(BWD_TILES["dq"]), forced)
    for warps, stages in FWD_SWEEP:
        tiles = dict(num_warps=warps, num_stages=stages)
        fn = lambda: selected_fwd(q, k, v, idx, config.sel_block, scale, 0, tiles=tiles, forced=forced)
        same = all(torch.equal(a, b) for a, b in zip(fn(), (o, lse)))
        print(f"T={T} selected fwd {warps} warps {stages} stages: {bench(fn):.3f} ms (equal: {same})", flush=True)
    for warps, stages in DQ_SWEEP:
        cfg = dict(num_warps=warps, num_stages=stages)
        fn = lambda: selected_bwd_dq(q, k, v, idx, do, lse, delta, config.sel_block, scale, 0, cfg, forced)
        same = torch.equal(fn(), want_dq)
        print(f"T={T} selected dQ {warps} warps {stages} stages: {bench(fn):.3f} ms (equal: {same})", flush=True)
    nb = triton.cdiv(T, config.sel_block)
    qseg = BWD_TILES["dkdv"]["QSEG"] or _dkdv_queries_per_program(tuple(idx.shape), nb, sm_count(DEV))
    pieces = {
        "delta = rowsum(o * do)": lambda: attn_bwd_delta(o, do),
        "dQ (forced + rest)": lambda: selected_bwd_dq(q, k, v, idx, do, lse, delta, config.sel_block, scale, 0,
                                                      dict(BWD_TILES["dq"]), forced),
        "inversion": lambda: invert_selection(idx, config.sel_block, 0, nb, qseg),
        "dK/dV (inversion included)": lambda: selected_bwd_dkdv(q, k, v, idx, do, lse, delta, config.sel_block, scale,
                                                                0, dict(BWD_TILES["dkdv"])),
        "whole backward": lambda: selected_bwd(q, k, v, idx, o, lse, do, config.sel_block, scale, 0, forced=forced),
        "forward": lambda: selected_fwd(q, k, v, idx, config.sel_block, scale, 0, forced=forced),
    }
    for name, fn in pieces.items():
        print(f"T={T} selected {name}: {bench(fn):.3f} ms", flush=True)


def inversion_profile(T: int, config: NSAConfig) -> None:
    """The device kernels of one selection inversion (dK/dV's query lists), by time."""
    q, k, _, _ = inputs(T, T + 3)
    idx = select_blocks(q, mean_compress(k, config), config, backend="triton")
    nb = triton.cdiv(T, config.sel_block)
    qseg = BWD_TILES["dkdv"]["QSEG"] or _dkdv_queries_per_program(tuple(idx.shape), nb, sm_count(DEV))
    for _ in range(3):
        invert_selection(idx, config.sel_block, 0, nb, qseg)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            invert_selection(idx, config.sel_block, 0, nb, qseg)
        torch.cuda.synchronize()
    print(f"T={T} inversion, 10 calls:", flush=True)
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25), flush=True)


def _previous(name: str):
    """The saved copy ``scripts/_old_<name>.py`` of a module before a change, or None."""
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(__file__), f"_old_{name}.py")
    if not os.path.exists(path):
        return None
    spec = importlib.util.spec_from_file_location(f"_old_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _previous_selected(T: int, config: NSAConfig, seed: int) -> tuple:
    """``(saved copy of the selected kernels, selected case)`` for an A/B section, or ``(None,
    None)`` without a saved copy (then nothing is computed)."""
    old = _previous("selected_kernel")
    return (None, None) if old is None else (old, selected_case(T, config, seed))


def compare_versions(T: int, what: str, fields: str, old, new, version: Callable) -> None:
    """A saved copy ``old`` of a module against the current ``new``: ``version(module)`` gives
    ``(run, timed)``, ``run()`` returning the outputs and ``timed`` the calls to time, each
    printed; then whether the outputs (``fields``) are bitwise equal."""
    outs = {}
    for name, module in (("previous", old), ("now", new)):
        run, timed = version(module)
        outs[name] = run()
        times = " / ".join(f"{bench(fn):.3f}" for fn in timed)
        print(f"T={T} {what}, {name}: {times} ms", flush=True)
    from nsa.testing import rel_error

    same = [torch.equal(a, b) for a, b in zip(outs["previous"], outs["now"])]
    errs = ", ".join(f"{rel_error(b, a):.1e}" for a, b in zip(outs["previous"], outs["now"]))
    print(f"T={T} {what}: {fields} bitwise equal {same}, relative difference {errs}", flush=True)


def cmp_select_ab(T: int, config: NSAConfig) -> None:
    """The fused compressed forward with selection against a saved copy of the previous code
    (``scripts/_old_compressed_fwd.py``, when present): time and bitwise equality."""
    from nsa.ops._triton import compressed_fwd as current

    old = _previous("compressed_fwd")
    if old is None:
        return
    q, k, v, _ = inputs(T, T + 4)
    k_cmp, v_cmp = mean_compress(k, config), mean_compress(v, config)
    scale = config.softmax_scale(D)

    def version(module):
        call = lambda: module.compressed_fwd(q, k_cmp, v_cmp, config, scale, 0, select=True)
        return call, (call,)

    compare_versions(T, "compressed + selection", "o, lse, block_idx", old, current, version)


def selected_dkdv_ab(T: int, config: NSAConfig) -> None:
    """The selected dK/dV against a saved copy of the previous kernels
    (``scripts/_old_selected_kernel.py``, when present): time and bitwise equality."""
    from nsa.ops.selected import kernel as current

    old, c = _previous_selected(T, config, T + 5)
    if old is None:
        return

    def version(module):
        call = lambda: module.selected_bwd_dkdv(c.q, c.k, c.v, c.idx, c.do, c.lse, c.delta, config.sel_block, c.scale,
                                                0, dict(BWD_TILES["dkdv"]))
        return call, (call,)

    compare_versions(T, "selected dK/dV (inversion included)", "dk, dv", old, current, version)


def cmp_bwd_ab(T: int, config: NSAConfig) -> None:
    """The compressed backward (dQ and dK/dV) against a saved copy of the previous kernels
    (``scripts/_old_compressed_kernel.py``, when present), then the current one by the programs
    per SM its dK/dV chunks aim at (``split_target``)."""
    from nsa.ops.compressed import kernel as current
    from nsa.ops._triton.compressed_fwd import compressed_fwd

    q, k, v, _ = inputs(T, T + 17)
    k_cmp, v_cmp = mean_compress(k, config), mean_compress(v, config)
    scale = config.softmax_scale(D)
    o, lse, _ = compressed_fwd(q, k_cmp, v_cmp, config, scale, 0)
    do = torch.randn_like(o)

    def version(module):
        call = lambda: module.compressed_bwd(q, k_cmp, v_cmp, o, lse, do, None, config, scale, 0)
        return call, (call,)

    old = _previous("compressed_kernel")
    if old is not None:
        compare_versions(T, "compressed backward", "dq, dk, dv", old, current, version)
    saved = current.DKDV_TILES["split_target"]
    first = None
    for _ in range(2):  # interleaved, so that drift shows
        if old is not None:
            timed_variant(T, "compressed backward, previous", version(old)[0], None)
        for target in CMP_SPLIT_TARGETS:
            current.DKDV_TILES["split_target"] = target
            first, _ = timed_variant(T, f"compressed backward, split_target {target}", version(current)[0], first)
    current.DKDV_TILES["split_target"] = saved


#: (rows, warps, stages, register cap or 0) of the window forward's sweep: the default first, then
#: wider tiles (fewer re-reads of each key tile), more stages, and capped registers with fewer
#: stages (more programs an SM: the kernel is at 41-45 % of both SM and L2 peak at 8k, session 23)
WINDOW_FWD_SWEEP = ((64, 4, 2, 0), (64, 4, 3, 0), (64, 8, 2, 0), (128, 8, 2, 0), (128, 8, 3, 0), (128, 4, 2, 0),
                    (64, 4, 1, 0), (64, 4, 1, 168), (64, 4, 2, 168), (32, 4, 2, 0))


def window_variants(T: int, config: NSAConfig) -> None:
    """Tiles of the window forward as the NSA ops launch it (with the selected branch's forced
    blocks, ``window_fwd_forced``): each against the first; then the dQ's (rows, BN, warps, stages)."""
    from nsa.ops.window import kernel as win

    q, k, v, _ = inputs(T, T + 7)
    scale = config.softmax_scale(D)
    first = None
    for rows, warps, stages, maxnreg in WINDOW_FWD_SWEEP:
        tiles = dict(rows=rows, num_warps=warps, num_stages=stages, **({"maxnreg": maxnreg} if maxnreg else {}))
        first, _ = timed_variant(T, f"window forward with forced blocks {tiles}",
                                 lambda: win.window_fwd_forced(q, k, v, config, scale, 0, tiles=tiles), first)
    o, lse = win.window_fwd(q, k, v, config.window, scale, 0)
    do = torch.randn_like(o)
    delta = attn_bwd_delta(o, do)
    want_dq = win.window_bwd_dq(q, k, v, do, lse, delta, config.window, scale, 0, win._bwd_cfg("dq", 16, D, D, None, q.dtype, q.device))
    for rows, bn, warps, stages in ((64, 64, 4, 2), (64, 128, 4, 2), (64, 128, 8, 2), (128, 128, 8, 2), (64, 128, 4, 3),
                                    (128, 64, 8, 3)):
        tiles = dict(rows=rows, BN=bn, num_warps=warps, num_stages=stages)
        cfg = win._bwd_cfg("dq", 16, D, D, {"dq": tiles}, q.dtype, q.device)
        fn = lambda: win.window_bwd_dq(q, k, v, do, lse, delta, config.window, scale, 0, cfg)
        err = (fn().float() - want_dq.float()).abs().max().item()
        print(f"T={T} window dQ {tiles}: {bench(fn):.3f} ms (max abs diff {err:.1e})", flush=True)


def kv_descriptors(T: int, config: NSAConfig) -> None:
    """The selected forward and dQ fetching their blocks through tensor descriptors (one bulk copy
    a block, ``KV_DESC``) or by plain loads, each alone with its error against plain loads; then
    the whole ``nsa_attention`` with the forward's choice flipped, twice each in turn. (Session 16
    also timed the window forward and dQ with descriptors: slower, dropped.)"""
    from nsa.ops.selected import kernel as sel

    c = selected_case(T, config, T + 11)
    q, k, v, scale = c.q, c.k, c.v, c.scale
    firsts: dict = {}
    for desc in (False, True):
        label = "descriptors" if desc else "plain loads"
        cases = {
            "selected fwd": lambda: sel.selected_fwd(q, k, v, c.idx, config.sel_block, scale, 0, forced=c.forced,
                                                     tiles=dict(KV_DESC=desc)),
            "selected dQ": lambda: (sel.selected_bwd_dq(q, k, v, c.idx, c.do, c.lse, c.delta, config.sel_block, scale,
                                                        0, dict(sel.BWD_TILES["dq"], KV_DESC=desc), c.forced),),
        }
        for name, fn in cases.items():
            firsts[name], _ = timed_variant(T, f"{name}, {label}", fn, firsts.get(name))
    x, kk, vv, gates, _ = inputs(T, T + 7, backward=True)
    run = training_step(x, kk, vv, gates, config)
    fwd = lambda: nsa_attention(x, kk, vv, gates, config, backend="triton")
    saved = sel.FWD_TILES["KV_DESC"]
    for rnd in (1, 2):
        for desc in (False, True):
            sel.FWD_TILES["KV_DESC"] = desc
            with torch.no_grad():
                f_ms = bench(fwd)
            print(f"T={T} nsa_attention, selected forward by {'descriptors' if desc else 'plain loads'} (round "
                  f"{rnd}): forward {f_ms:.3f} ms, forward+backward {bench(run):.3f} ms", flush=True)
    sel.FWD_TILES["KV_DESC"] = saved


def forced_variants(T: int, config: NSAConfig) -> None:
    """The forced-block kernels alone, by (rows, warps, stages), and the rest of the forward."""
    from nsa.ops.selected import kernel as sel

    c = selected_case(T, config, T + 8)
    dims = sel._dims(c.q, c.k, c.v, c.idx, config.sel_block, c.forced)
    fargs, dargs = forced_kernel_args(c, c.o, c.lse, torch.empty_like(c.q))
    cfg = sel._warps(dict(sel.FWD_TILES, BQ=1, KV_DESC=False), dims, 1)  # one query a program, plain loads
    rest = lambda: sel.selected_fwd_kernel[(T, dims["H"])](*fargs, c.o, c.o, c.o, c.o, **cfg, **dims)  # no gated sum
    print(f"T={T} selected fwd without the forced kernel: {bench(rest):.3f} ms", flush=True)
    for rows, warps, stages in FORCED_SWEEP:
        with tiles_as_default(sel.FORCED_TILES, rows=rows, num_warps=warps, num_stages=stages):
            meta, BT = sel._forced_launch(dims)
        fwd = lambda: sel.selected_forced_fwd_kernel[(triton.cdiv(T, BT), dims["H"])](*fargs, **meta)
        bwd = lambda: sel.selected_forced_dq_kernel[(triton.cdiv(T, BT), dims["H"])](*dargs, **meta, **DQ_META)
        print(f"T={T} forced fwd / dQ, rows {rows}, {warps} warps, {stages} stages: {bench(fwd):.3f} / {bench(bwd):.3f} ms",
              flush=True)


def forced_ab(T: int, config: NSAConfig) -> None:
    """The forced-block kernels against a saved copy of the previous selected kernels
    (``scripts/_old_selected_kernel.py``, when present): time and bitwise equality."""
    from nsa.ops.selected import kernel as sel

    old, c = _previous_selected(T, config, T + 9)
    if old is None:
        return
    dims = sel._dims(c.q, c.k, c.v, c.idx, config.sel_block, c.forced)
    meta, BT = sel._forced_launch(dims)

    def version(module):
        outs = torch.empty_like(c.o), torch.empty_like(c.lse), torch.empty_like(c.q)
        fargs, dargs = forced_kernel_args(c, *outs)
        fwd = lambda: module.selected_forced_fwd_kernel[(triton.cdiv(T, BT), dims["H"])](*fargs, **meta)
        bwd = lambda: module.selected_forced_dq_kernel[(triton.cdiv(T, BT), dims["H"])](*dargs, **meta, **DQ_META)
        return (lambda: (fwd(), bwd(), outs)[-1]), (fwd, bwd)

    compare_versions(T, "forced fwd / dQ", "o, lse, dq", old, sel, version)


def gated_window_ab(T: int, config: NSAConfig) -> None:
    """Inference: the window branch then the gated sum (two launches, ``o_win`` stored) against
    the window kernel writing the gated sum itself; results compared bitwise."""
    from nsa.ops import combine_branches, sliding_window_attention
    from nsa.ops.window.kernel import window_gated_sum

    q, k, v, gates = inputs(T, T + 11)
    o_cmp, o_slc = torch.randn_like(q), torch.randn_like(q)
    scale = config.softmax_scale(D)
    apart = lambda: combine_branches(gates, o_cmp, o_slc, sliding_window_attention(q, k, v, config, backend="triton"),
                                     backend="triton")
    fused = lambda: window_gated_sum(q, k, v, gates, o_cmp, o_slc, config, scale, 0)
    with torch.no_grad():
        same = torch.equal(apart(), fused())
        print(f"T={T} window + gated sum: apart {bench(apart):.3f} ms, in one kernel {bench(fused):.3f} ms "
              f"(bitwise equal: {same})", flush=True)


#: (rows, block_n, warps, stages, max_splits) of the compressed dK/dV kernel; the first is the
#: default before session 9. Session 9's first call also measured (64, 128, 8, 2, 8), (32, 128, 8, 3, 8),
#: (128, 128, 8, 2, 8) and (32, 64, 4, 3, 8), all slower than (64, 128, 8, 3, 16) (docs/perf/prefill.md)
CMP_DKDV_SWEEP = ((64, 64, 4, 2, 8), (64, 128, 8, 3, 16), (64, 128, 8, 3, 32), (64, 128, 8, 4, 16),
                  (64, 128, 8, 4, 32), (64, 128, 8, 3, 64), (64, 64, 4, 2, 32), (64, 64, 4, 3, 32))
#: overrides of the selected dK/dV launch (``BWD_TILES["dkdv"]``), each against the default (3 stages
#: on Hopper); session 9 also measured 8 warps (with 2 or 3 stages, and with 8 queries a step) and
#: QSEG 512 or 2048 at 2 stages, all slower or no faster at 64k (docs/perf/prefill.md)
SEL_DKDV_SWEEP = ({}, {"num_stages": 2}, {"num_stages": 4}, {"QSEG": 512}, {"QSEG": 2048})
#: programs per SM aimed at by the compressed dK/dV query chunks (``cmp_bwd``); 24 is the default
CMP_SPLIT_TARGETS = (8, 16, 24)


def timed_variant(T: int, label: str, fn: Callable[[], tuple], first: Optional[tuple],
                  outputs: slice = slice(None)) -> Tuple[Optional[tuple], Optional[float]]:
    """One variant of a sweep: run ``fn`` (a variant that fails is reported, not fatal), time it and
    print the relative error of its ``outputs`` against ``first``, the first variant's result (this
    one's when ``first`` is None). Returns ``(first, ms)``, ``ms`` None for a failed variant."""
    from nsa.testing import rel_error

    try:
        out = fn()
    except Exception as err:  # noqa: BLE001
        print(f"T={T} {label}: {type(err).__name__}: {err}", flush=True)
        return first, None
    first = first or out
    ms = bench(fn)
    errs = ", ".join(f"{rel_error(a, b):.1e}" for a, b in zip(out[outputs], first[outputs]))
    print(f"T={T} {label}: {ms:.3f} ms (relative error against the first variant: {errs})", flush=True)
    return first, ms


def _sel_dkdv_sweep(T: int, config: NSAConfig, sweep: tuple, training: bool) -> None:
    """Launches of the selected dK/dV kernel (the inversion included), dk/dv against the first's;
    with ``training`` as the training path launches it: gated, each query's local blocks left to
    the window's kernel (``skip_local``, so no causal mask), each pair's dS stored for the dQ."""
    from nsa.ops.selected import kernel as sel

    c = selected_case(T, config, T + (17 if training else 16))
    extra = ()
    if training:
        gate = torch.rand(c.q.shape[:3], device=c.q.device, dtype=torch.float32)
        extra = (gate, c.forced[1], sel.ds_buffer(c.q, c.idx, config.sel_block, dict(sel.BWD_TILES["dq"])))
    first = None
    for override in sweep:
        cfg = dict(sel.BWD_TILES["dkdv"], **override)
        fn = lambda: sel.selected_bwd_dkdv(c.q, c.k, c.v, c.idx, c.do, c.lse, c.delta, config.sel_block, c.scale, 0,
                                           cfg, *extra)
        label = "selected dK/dV, training's launch" if training else "selected dK/dV"
        first, _ = timed_variant(T, f"{label} {override or 'default'}", fn, first)


def sel_dkdv_variants(T: int, config: NSAConfig) -> None:
    """Launches of the selected dK/dV kernel as the op alone runs it (:func:`_sel_dkdv_sweep`)."""
    _sel_dkdv_sweep(T, config, SEL_DKDV_SWEEP, training=False)


#: launch overrides of the selected dK/dV as training runs it (``sel_dkdv_ds``); the first is the default
SEL_DKDV_DS_SWEEP = ({}, {"BQ": 2}, {"BQ": 8}, {"num_stages": 2}, {"QSEG": 512}, {"QSEG": 2048}, {"num_warps": 8})


def sel_dkdv_ds_variants(T: int, config: NSAConfig) -> None:
    """Launches of the selected dK/dV kernel as the training path runs it (:func:`_sel_dkdv_sweep`)."""
    _sel_dkdv_sweep(T, config, SEL_DKDV_DS_SWEEP, training=True)


def cmp_dkdv_variants(T: int, config: NSAConfig) -> None:
    """Tiles of the compressed dK/dV kernel: the whole compressed backward (dq unchanged) per
    variant, its dk/dv against the first variant's (relative error), then the whole
    ``nsa_attention`` forward+backward with the first and the fastest variant as the default."""
    from nsa.ops.compressed import kernel as ck
    from nsa.ops._triton.compressed_fwd import compressed_fwd

    q, k, v, gates = inputs(T, T + 13)
    k_cmp, v_cmp = mean_compress(k, config), mean_compress(v, config)
    scale = config.softmax_scale(D)
    o, lse, _ = compressed_fwd(q, k_cmp, v_cmp, config, scale, 0)
    do = torch.randn_like(o)
    first, times = None, {}
    for *tiles, cap in CMP_DKDV_SWEEP:
        fn = lambda: ck.compressed_bwd(q, k_cmp, v_cmp, o, lse, do, None, config, scale, 0, dkdv=tuple(tiles),
                                       max_splits=cap)
        first, ms = timed_variant(T, f"cmp bwd, dK/dV {tiles} splits<={cap} (dk, dv)", fn, first, slice(1, None))
        if ms is not None:
            times[(*tiles, cap)] = ms
    _cmp_dkdv_whole_step(T, config, (CMP_DKDV_SWEEP[0], min(times, key=times.get)))


def _cmp_dkdv_whole_step(T: int, config: NSAConfig, variants: tuple) -> None:
    """The whole ``nsa_attention`` forward+backward with each compressed dK/dV launch of ``variants``
    (``(rows, block_n, warps, stages, max_splits)``) as the default, in turn, twice."""
    from nsa.ops.compressed import kernel as ck

    q, k, v, gates, _ = inputs(T, T + 14, backward=True)
    run = training_step(q, k, v, gates, config)
    for _ in range(2):
        for variant in variants:
            with tiles_as_default(ck.DKDV_TILES, tiles=tuple(variant[:4]), max_splits=variant[4]):
                print(f"T={T} nsa fwd+bwd, cmp dK/dV {variant}: {bench(run):.3f} ms", flush=True)


#: dK/dV launches of the window timed by ``win_dkdv``, ``win_dkdv_kernels`` and ``win_dkdv_step`` (over
#: :data:`nsa.ops.window.kernel.BWD_TILES`; the last two take the first two). Session 54 (H200, ms at
#: 8k / 64k; ``raw/session54_prefill_win_*_h200.txt``). Alone, L2 flushed, run 1: the walk from each
#: band's start on 64-row tiles (the default until then) 1.171-1.176 / 9.18-9.21; phased 1.055-1.058 /
#: 8.30; phased on 32-row tiles 0.934-0.936 / 7.35-7.36, in 2 stages 1.129-1.135 / 8.72; phased 64-row
#: tiles in 2 stages 1.027-1.029 / 7.98; phased 64-key tiles of 4 warps 0.973-0.984 / 7.99-8.02. Run 2:
#: 32-row tiles 0.910-0.912 / 7.25-7.37, phased 0.929-0.935 / 7.35; phased 16 rows 1.104-1.112 / 8.64,
#: 4 stages 0.943-0.944 / 7.46. In place the 32-row tiles (walked) were the slower (64k, 5 profiled
#: steps a list: 8.46-8.53 against 7.52-7.57), and so was the whole step in ABBA rounds (98.36-98.77
#: against 96.97-97.71; 8k 7.01-7.13 against 6.93-7.07), though the sweeps' own A/Bs, the 64-row tiles
#: first in each round, had put them 1.2-2.3 ms ahead. The phased 64-row tiles in place: 8.99-9.03
#: against 9.66-10.05 for the walk; the whole step in ABBA rounds on two machines 98.33-98.69 and
#: 99.76-100.14 against 99.21-99.71 and 100.76-101.50 (8k 7.11-7.20 and 7.16-7.33 against 7.20-7.28
#: and 7.31-7.49). Compiled for sm_90 (Triton 3.6, ``scripts/launch_resources.py``), 64-row tiles of
#: 128 keys hold 255 registers and spill 328 bytes a thread (360 phased), 32-row ones none (16 bytes in
#: 4 stages), 16-row ones take 232.
WINDOW_DKDV_SWEEP = (
    ("phased (the default)", {}),
    ("walk from the band's start (the default to session 53)", dict(PHASED=False)),
    ("32 rows", dict(rows=32, PHASED=False)),
    ("32 rows, phased", dict(rows=32)),
)


def window_dkdv_tiles(T: int, config: NSAConfig) -> None:
    """The window's dK/dV as training launches it (with the selected branch's local blocks, gated,
    adding to given dk/dv) by :data:`WINDOW_DKDV_SWEEP`, in turn over rounds; dk/dv of each against
    the first's (relative error); then the whole ``nsa_attention`` forward+backward with the first
    two and the fastest variant as the default, in turn."""
    from nsa.ops.training import training_forward
    from nsa.ops.window import kernel as win
    from nsa.testing import rel_error

    leaves = inputs(T, T + 21, backward=True)
    q, k, v, gates, do = (x.detach() for x in leaves)
    k_cmp, v_cmp = mean_compress(k, config), mean_compress(v, config)
    with torch.no_grad():
        _, _, (_, _, _, lse_slc, _, lse_win) = training_forward(q, k, v, k_cmp, v_cmp, gates, None, None, config, 0)
    gate = torch.rand(3, 1, T, q.shape[2], device=DEV)
    delta = torch.randn(3, 1, T, q.shape[2], device=DEV) * 0.1
    forced = dict(config=config, lse=lse_slc, delta=delta[1], gate=gate[1])
    scale, group = config.softmax_scale(D), q.shape[2] // k.shape[2]
    dkv = (torch.zeros_like(k), torch.zeros_like(v))

    def launch(tiles: dict, into=None):
        cfg = win._bwd_cfg("dkdv", group, D, D, {"dkdv": tiles}, q.dtype, q.device)
        return win.window_bwd_dkdv(q, k, v, do, lse_win, delta[2], config.window, scale, 0, cfg, gate=gate[2],
                                   forced=forced, dkv=into)

    first = launch(WINDOW_DKDV_SWEEP[0][1])
    for label, tiles in WINDOW_DKDV_SWEEP[1:]:
        errors = [f"{name} {rel_error(a, b):.2e}" for name, a, b in zip(("dk", "dv"), launch(tiles), first)]
        print(f"T={T} window dK/dV {label} against the first: {', '.join(errors)}", flush=True)
    times = {label: [] for label, _ in WINDOW_DKDV_SWEEP}
    for _ in range(3):
        for label, tiles in WINDOW_DKDV_SWEEP:
            times[label].append(bench(lambda: launch(tiles, dkv)))
    for label, ms in times.items():
        print(f"T={T} window dK/dV, {label}: {' '.join(f'{t:.3f}' for t in ms)} ms", flush=True)
    best = min(times, key=lambda label: statistics.median(times[label]))
    q, k, v, gates = leaves[:4]
    run = training_step(q, k, v, gates, config)
    chosen = [(label, tiles) for i, (label, tiles) in enumerate(WINDOW_DKDV_SWEEP) if i < 2 or label == best]
    whole = {label: [] for label, _ in chosen}
    for _ in range(2):
        for label, tiles in chosen:
            with tiles_as_default(win.BWD_TILES["dkdv"], **tiles):
                whole[label].append(bench(run))
    for label, ms in whole.items():
        print(f"T={T} nsa fwd+bwd, window dK/dV {label}: {' '.join(f'{t:.3f}' for t in ms)} ms", flush=True)


def window_dkdv_kernels(T: int, config: NSAConfig) -> None:
    """:func:`kernels_by_default` of the window's dK/dV on the first two tiles of
    :data:`WINDOW_DKDV_SWEEP`: where each kernel's time goes in place, not alone."""
    from nsa.ops.window import kernel as win

    kernels_by_default(T, config, win.BWD_TILES["dkdv"], WINDOW_DKDV_SWEEP[:2], "window dK/dV")


def window_dkdv_step(T: int, config: NSAConfig) -> None:
    """:func:`step_abba` of the window's dK/dV on the first two tiles of :data:`WINDOW_DKDV_SWEEP`,
    to set against the kernel lists of ``win_dkdv_kernels``."""
    from nsa.ops.window import kernel as win

    step_abba(T, config, win.BWD_TILES["dkdv"], WINDOW_DKDV_SWEEP[:2], "window dK/dV")


#: The prefill top-n's radix select: only the rounds below the first bit where its two bounds
#: differ (the default), or all 31 (``nsa.ops._triton.block_topn.LAUNCH``); timed by ``topn_bounds``.
TOPN_BOUNDS = (("rounds from the bounds", dict(bounds=True)), ("all 31 rounds", dict(bounds=False)))


def topn_bounds(T: int, config: NSAConfig) -> None:
    """The forward (``no_grad``) and the whole forward+backward in ABBA rounds (:func:`step_abba`), and
    the forward's kernel lists (:func:`kernels_by_default`), with each top-n of :data:`TOPN_BOUNDS`;
    first, whether both choose the same blocks."""
    from nsa.ops._triton import block_topn as topn

    q, k, v, _ = inputs(T, T + 25)
    chosen = []
    for _, tiles in TOPN_BOUNDS:
        with tiles_as_default(topn.LAUNCH, **tiles):
            chosen.append(select_blocks(q, mean_compress(k, config), config, backend="triton"))
    print(f"T={T} top-n, the same blocks either way: {torch.equal(*chosen)}", flush=True)
    ab_rounds_and_lists(T, config, topn.LAUNCH, TOPN_BOUNDS, "top-n")


#: Pass 2 of the compressed forward in a launch of its own (``compressed_fwd.PASS2_APART``): fused,
#: then pass-2 launches by blocks a step, stages, warps and rows (``rows`` None: pass 1's 64). Compiled
#: for sm_90 (Triton 3.6, head dim 128), registers / shared memory: the fused kernel 187 / 113 KiB (2
#: programs an SM); pass 2 alone 127 / 113 KiB (32 blocks, 3 stages), 128 / 81 KiB (32, 2), 70 / 65
#: KiB (16, 3), 76 / 49 KiB (16, 2), 46 / 32 KiB (8, 2); 128 rows of 8 warps 76 / 64 KiB (16, 2), 72
#: / 81 KiB (16, 3); 256 rows of 16 warps 96 / 97 KiB (16, 2), 46 / 80 KiB (8, 2). Session 56's first
#: call swept the first seven (``pass2_apart``), its second those around the fastest, (16, 2)
#: (``pass2_tiles``), its third wider ones (``pass2_wide``).
_APART = dict(enabled=True, num_warps=4, maxnreg=None, rows=None)
PASS2_SPLITS = (
    ("fused", dict(enabled=False)),
    ("apart 32 blocks, 3 stages", dict(_APART, blocks_per_step=32, num_stages=3)),
    ("apart 32 blocks, 2 stages", dict(_APART, blocks_per_step=32, num_stages=2)),
    ("apart 16 blocks, 3 stages", dict(_APART, blocks_per_step=16, num_stages=3)),
    ("apart 16 blocks, 2 stages", dict(_APART, blocks_per_step=16, num_stages=2)),
    ("apart 8 blocks, 3 stages", dict(_APART, blocks_per_step=8, num_stages=3)),
    ("apart 32 blocks, 3 stages, 8 warps", dict(_APART, blocks_per_step=32, num_stages=3, num_warps=8)),
)
PASS2_TILES = (
    ("fused", dict(enabled=False)),
    ("apart 16 blocks, 2 stages", dict(_APART, blocks_per_step=16, num_stages=2)),
    ("apart 8 blocks, 2 stages", dict(_APART, blocks_per_step=8, num_stages=2)),
    ("apart 16 blocks, 4 stages", dict(_APART, blocks_per_step=16, num_stages=4)),
    ("apart 128 rows, 16 blocks, 2 stages", dict(_APART, blocks_per_step=16, num_stages=2, num_warps=8, rows=128)),
    ("apart 128 rows, 16 blocks, 3 stages", dict(_APART, blocks_per_step=16, num_stages=3, num_warps=8, rows=128)),
    ("apart 128 rows, 32 blocks, 2 stages", dict(_APART, blocks_per_step=32, num_stages=2, num_warps=8, rows=128)),
)


PASS2_WIDE = (
    ("fused", dict(enabled=False)),
    ("the default (128 rows, 16 blocks, 2 stages, 8 warps)", {}),
    ("apart 128 rows, 8 blocks, 2 stages", dict(_APART, blocks_per_step=8, num_stages=2, num_warps=8, rows=128)),
    ("apart 256 rows, 16 blocks, 2 stages, 16 warps", dict(_APART, blocks_per_step=16, num_stages=2, num_warps=16,
                                                            rows=256)),
    ("apart 256 rows, 8 blocks, 2 stages, 16 warps", dict(_APART, blocks_per_step=8, num_stages=2, num_warps=16,
                                                           rows=256)),
)


#: Pass 1's launch where pass 2 runs apart (``PASS2_APART["pass1"]``), with the default pass 2.
#: Compiled for sm_90 (registers / shared memory): 64 rows, 64-token tiles, 3 stages (the fused
#: launch's) 174 / 112 KiB, 2 programs an SM; 32-token tiles in 3 stages 124 / 64 KiB, 3 an SM; in 4
#: stages 126 / 80 KiB; 128 rows of 8 warps, 64-token tiles, 2 stages 191 / 96 KiB, 1 an SM.
PASS1_TILES = (
    ("fused", dict(enabled=False)),
    ("pass 1 as fused (64 rows, 64 tokens, 3 stages)", dict(pass1=None)),
    ("pass 1 in 32-token tiles, 3 stages", dict(pass1=dict(BN=32, num_stages=3))),
    ("pass 1 in 32-token tiles, 4 stages", dict(pass1=dict(BN=32, num_stages=4))),
    ("pass 1 in 32-token tiles, 2 stages", dict(pass1=dict(BN=32, num_stages=2))),
    ("pass 1 in 128 rows of 8 warps, 2 stages", dict(pass1=dict(BT=8, num_warps=8, num_stages=2))),
)


def _pass2_sweep(T: int, config: NSAConfig, splits: tuple) -> dict:
    """The compressed forward with selection (as ``nsa_attention`` calls it) with each launch of
    ``splits``, two rounds of each in turn, checked bitwise against the fused launch: ``{label:
    [ms, ms]}``."""
    from nsa.ops._triton import compressed_fwd as module
    from nsa.ops._triton.compressed_fwd import compressed_fwd

    q, k, v, _ = inputs(T, T + 4)
    k_cmp, v_cmp = mean_compress(k, config), mean_compress(v, config)
    scale = config.softmax_scale(D)
    call = lambda: compressed_fwd(q, k_cmp, v_cmp, config, scale, 0, store_o=True, select=True)
    with tiles_as_default(module.PASS2_APART, enabled=False):
        fused = call()
    times = {label: [] for label, _ in splits}
    for _ in range(2):
        for label, tiles in splits:
            with tiles_as_default(module.PASS2_APART, **tiles):
                out = call()
                same = all(torch.equal(a, b) for a, b in zip(out, fused))
                times[label].append(bench(call))
                close = "" if same else (
                    f"; o within {(out[0].float() - fused[0].float()).abs().max().item():.2e}, "
                    f"{(out[2] == fused[2]).all(-1).float().mean().item():.5f} of block rows equal")
                print(f"T={T} compressed forward with selection, {label}: {times[label][-1]:.3f} ms "
                      f"(o, lse and blocks equal to the fused launch's: {same}{close})", flush=True)
    return times


def pass2_apart(T: int, config: NSAConfig) -> None:
    """:func:`_pass2_sweep` over :data:`PASS2_SPLITS`, then the fastest split against the fused launch
    in the whole forward and forward+backward (ABBA, :func:`step_abba`) and the forward's kernel lists."""
    from nsa.ops._triton import compressed_fwd as module

    times = _pass2_sweep(T, config, PASS2_SPLITS)
    best = min(PASS2_SPLITS[1:], key=lambda split: statistics.mean(times[split[0]]))
    print(f"T={T} fastest split: {best[0]}", flush=True)
    variants = (PASS2_SPLITS[0], best)
    ab_rounds_and_lists(T, config, module.PASS2_APART, variants, "pass 2")


#: The compressed forward's short walks (queries that see at most ``SHORT_TOKENS`` compressed tokens:
#: 16k and shorter; on Hopper ``GLUON_SHORT_TOKENS``) all in the fused launch's short tiles, or all in
#: the long walks' passes apart (the Gluon pass 1 and scoring pass on Hopper).
SHORT_APART = (("short walks fused", {"SHORT_TOKENS": 1024, "GLUON_SHORT_TOKENS": 1024}),
               ("short walks apart", {"SHORT_TOKENS": 0, "GLUON_SHORT_TOKENS": 0}))


#: ``(label, FWD_TILES over the default)`` of :func:`sel_regs`. Compiled for sm_90 (8k, session 73):
#: 2 stages 255 registers and 36.9 KB (6 programs an SM, by shared memory); 1 stage 255 and 20.5 KB (8,
#: by registers); capped at 192 registers 136 B of stack, at 168 232 B (10 an SM either way, by shared
#: memory); the entry loop 564, 539, 592 and 662 instructions.
SEL_REGS = (
    ("the default (2 stages: 6 programs an SM)", {}),
    ("1 stage (8 programs an SM)", dict(num_stages=1)),
    ("1 stage, 192 registers (10 programs an SM)", dict(num_stages=1, maxnreg=192)),
    ("1 stage, 168 registers (10 programs an SM)", dict(num_stages=1, maxnreg=168)),
)


def sel_regs(T: int, config: NSAConfig) -> None:
    """The selected forward (inference: from the window's forced-block result, the gated sum
    written) by :data:`SEL_REGS`, bitwise against the default's output, two rounds; the fastest,
    where it beats the default in both rounds, in the whole forward (ABBA) and its kernel lists."""
    from nsa.ops.selected import kernel as sel
    from nsa.ops.window.kernel import window_fwd_forced

    q, k, v, gates, scale, o_cmp, idx = _selected_inputs(T, config, T + 21)
    win = window_fwd_forced(q, k, v, config, scale, 0)
    run = lambda: _selected_after_window(q, k, v, gates, idx, o_cmp, win, config)  # noqa: E731
    want = run()
    times: dict = {}
    for rnd in (1, 2):
        for label, tiles in SEL_REGS:
            with tiles_as_default(sel.FWD_TILES, **tiles):
                same = torch.equal(run(), want)
                ms = bench(run)
            times.setdefault(label, []).append(ms)
            print(f"T={T} selected forward, {label} (round {rnd}): {ms:.3f} ms (bitwise the default's: {same})",
                  flush=True)
    default = SEL_REGS[0][0]
    best = min(times, key=lambda label: max(times[label]))
    if best != default and max(times[best]) < min(times[default]):
        variants = (SEL_REGS[0], (best, dict(SEL_REGS)[best]))
        step_abba(T, config, sel.FWD_TILES, variants, "selected forward", forward=True)
        kernels_by_default(T, config, sel.FWD_TILES, variants, "selected forward", forward=True)


#: Programs (so SMs) of the persistent window forward beside the selected forward (``win_slc_partition``).
PARTITION_PROGRAMS = (66, 44, 33, 22)


def win_slc_partition(T: int, config: NSAConfig) -> None:
    """The window forward on part of the GPU and the selected forward beside it on a second stream,
    against the two in turn (:data:`PARTITION_PROGRAMS`; the doc of section 42)."""
    from unittest import mock

    from nsa.ops.window.kernel import window_fwd_forced

    q, k, v, gates, scale, o_cmp, idx = _selected_inputs(T, config, T + 23)
    win_full = window_fwd_forced(q, k, v, config, scale, 0)

    def window(programs: Optional[int] = None):
        """The window launch, on ``programs`` programs (its persistent grid is one an SM) or all SMs."""
        grid = mock.patch("nsa.ops._triton.device.sm_count", lambda device: programs) if programs else nullcontext()
        with grid:
            return window_fwd_forced(q, k, v, config, scale, 0)

    selected = lambda: _selected_after_window(q, k, v, gates, idx, o_cmp, win_full, config)  # noqa: E731
    in_turn = lambda: _selected_after_window(q, k, v, gates, idx, o_cmp, window(), config)  # noqa: E731
    s_win, s_slc = torch.cuda.Stream(), torch.cuda.Stream()

    def beside(programs: int):
        main = torch.cuda.current_stream()
        s_win.wait_stream(main)
        s_slc.wait_stream(main)
        with torch.cuda.stream(s_win):
            window(programs)
        with torch.cuda.stream(s_slc):
            selected()
        main.wait_stream(s_win)
        main.wait_stream(s_slc)

    same = all(torch.equal(a, b) for a, b in zip(window(PARTITION_PROGRAMS[-1]), win_full))
    print(f"T={T} window forward on {PARTITION_PROGRAMS[-1]} programs bitwise the whole launch's: {same}", flush=True)
    for rnd in (1, 2):
        print(f"T={T} round {rnd}: window alone {bench(window):.3f} ms, selected alone {bench(selected):.3f}, "
              f"the two in turn {bench(in_turn):.3f}", flush=True)
        for programs in PARTITION_PROGRAMS:
            print(f"T={T} round {rnd}, window on {programs} programs: alone {bench(lambda: window(programs)):.3f} ms, "
                  f"beside the selected forward {bench(lambda: beside(programs)):.3f}", flush=True)


def short_apart(T: int, config: NSAConfig) -> None:
    """:data:`SHORT_APART`: the forward and forward+backward (ABBA) and the forward's kernel lists
    (:func:`ab_rounds_and_lists`), after each variant's selections against the default's."""
    from nsa.ops._triton import compressed_fwd as module
    from nsa.testing import rel_error

    q, k, v, _ = inputs(T, T + 4)
    k_cmp, v_cmp = mean_compress(k, config), mean_compress(v, config)
    outs = {}
    for label, tiles in SHORT_APART:
        with tiles_as_default(vars(module), **tiles):
            outs[label] = module.compressed_fwd(q, k_cmp, v_cmp, config, config.softmax_scale(D), 0, store_o=True,
                                                select=True)
    (o_a, lse_a, idx_a), (o_b, lse_b, idx_b) = (outs[label] for label, _ in SHORT_APART)
    same = (idx_a == idx_b).all(-1).float().mean().item() * 100
    print(f"T={T} short walks apart against fused: o {rel_error(o_b, o_a):.1e}, lse {rel_error(lse_b, lse_a):.1e}, "
          f"{same:.3f} % of the (query, head) selections equal", flush=True)
    ab_rounds_and_lists(T, config, vars(module), SHORT_APART, "compressed short walks")


def pass2_tiles(T: int, config: NSAConfig) -> None:
    """:func:`_pass2_sweep` over :data:`PASS2_TILES`."""
    _pass2_sweep(T, config, PASS2_TILES)


def pass1_tiles(T: int, config: NSAConfig) -> None:
    """:func:`_pass2_sweep` over :data:`PASS1_TILES` (pass 1's tiles where pass 2 runs apart)."""
    _pass2_sweep(T, config, PASS1_TILES)


#: Pass 1 in 128-row tiles (8 query positions) at two programs an SM, so that each K/V tile it loads
#: from L2 serves twice the rows (session 57; the default first). Compiled for sm_90 (registers /
#: shared memory, instructions a step): the fused launch's (64 rows, 64 tokens, 4 warps, 3 stages) 174 / 112
#: KiB, 356 for 64 x 64 row-tokens, 2 programs an SM; 128 rows of 8 warps in 32-token tiles 127 / 80
#: KiB in 3 stages, 123 / 96 KiB in 4, 266-270 for 128 x 32 (2 an SM); in 64-token tiles capped at
#: 128 registers 128 / 96 KiB in 2 stages, 383 for 128 x 64, but ptxas then waits for every product
#: of a group (2 an SM). Session 56 measured 128 rows of 8 warps in 64-token tiles uncapped (191
#: registers, 1 an SM): slower. Session 57 (H200, the compressed forward with selection, two rounds,
#: ms at 64k / 32k): the fused launch's tiles 17.15, 17.34 / 4.65, 4.70; 32-token tiles in 3 stages
#: 17.17, 17.43 / 4.64, 4.67, in 4 stages 17.29, 17.46 / 4.66, 4.66; 64-token tiles capped at 128
#: registers 16.37, 16.49 / 4.44, 4.44, then the default (``PASS2_APART["pass1"]``).
PASS1_WIDE = (
    ("the default (128 rows of 8 warps, 64 tokens, 2 stages, 128 registers)", {}),
    ("pass 1 as fused (64 rows, 64 tokens, 4 warps, 3 stages)", dict(pass1=None)),
    ("pass 1 in 128 rows of 8 warps, 32 tokens, 3 stages", dict(pass1=dict(rows=128, BN=32, num_warps=8, num_stages=3))),
    ("pass 1 in 128 rows of 8 warps, 32 tokens, 4 stages", dict(pass1=dict(rows=128, BN=32, num_warps=8, num_stages=4))),
)


def _pass1_sweep_then_abba(T: int, config: NSAConfig, variants: tuple) -> None:
    """:func:`_pass2_sweep` over ``variants`` (the default first); where another launch is faster
    than the default in both rounds, it against the default in the whole forward and
    forward+backward (ABBA) and the forward's kernel lists (:func:`ab_rounds_and_lists`)."""
    from nsa.ops._triton import compressed_fwd as module

    times = _pass2_sweep(T, config, variants)
    default = variants[0][0]
    best = min(times, key=lambda label: max(times[label]))
    if best != default and max(times[best]) < min(times[default]):
        ab_rounds_and_lists(T, config, module.PASS2_APART, (variants[0], (best, dict(variants)[best])), "pass 1")


def pass1_wide(T: int, config: NSAConfig) -> None:
    """:func:`_pass1_sweep_then_abba` over :data:`PASS1_WIDE`."""
    _pass1_sweep_then_abba(T, config, PASS1_WIDE)


#: Pass 1 (128 rows of 8 warps, through descriptors) in launches whose wgmma ptxas does not serialise.
#: Session 62's GPU test found the default's serialised for want of registers (C7512: 64-token tiles
#: capped at 128 registers, 48 bytes spilled). Compiled for sm_90 (registers, spills; none of these
#: with C7512): 32-token tiles 128, 8 B in 2 stages, 128, 16 B in 3; 16-token tiles 124, none; 64-token
#: tiles capped at 144 registers 144, 36 B, at 168 168, 8 B (one program an SM, not two). Session 57
#: measured 32-token tiles slower than the default, but by pointer loads (descriptors came in
#: session 59).
_DESC_PASS1 = dict(rows=128, num_warps=8, kv_desc=True)
PASS1_SERIAL = (
    ("the default (64 tokens, 2 stages, 128 registers: C7512)", {}),
    ("32 tokens, 2 stages, 128 registers", dict(pass1=dict(_DESC_PASS1, BN=32, num_stages=2, maxnreg=128))),
    ("32 tokens, 3 stages, 128 registers", dict(pass1=dict(_DESC_PASS1, BN=32, num_stages=3, maxnreg=128))),
    ("16 tokens, 2 stages, 128 registers", dict(pass1=dict(_DESC_PASS1, BN=16, num_stages=2, maxnreg=128))),
    ("64 tokens, 2 stages, 144 registers", dict(pass1=dict(_DESC_PASS1, BN=64, num_stages=2, maxnreg=144))),
    ("64 tokens, 2 stages, 168 registers", dict(pass1=dict(_DESC_PASS1, BN=64, num_stages=2, maxnreg=168))),
)


def pass1_serial(T: int, config: NSAConfig) -> None:
    """:func:`_pass1_sweep_then_abba` over :data:`PASS1_SERIAL`."""
    _pass1_sweep_then_abba(T, config, PASS1_SERIAL)


#: Pass 1's whole key/value tiles through tensor descriptors (session 59). Compiled for sm_90 (128
#: rows of 8 warps, 64-token tiles, 2 stages, 128 registers): the unmasked step takes 353
#: instructions against 383 with pointer loads, 128 registers either way. H200, 64k (ms; the
#: pointer loads first): the compressed forward with selection 16.19, 16.22 against 15.89, 15.97; the
#: whole forward and forward+backward 0.2-0.3 ms shorter in 3 and 4 of 4 ABBA rounds; bitwise the
#: same results. Since then the default (``PASS2_APART["pass1"]["kv_desc"]``).
PASS1_DESC = (
    ("pass 1 by pointer loads", dict(pass1=dict(PASS2_APART["pass1"], kv_desc=False))),
    ("the default (pass 1's whole tiles through descriptors)", {}),
)


def pass1_desc(T: int, config: NSAConfig) -> None:
    """:func:`_pass2_sweep` over :data:`PASS1_DESC`, then the two in the whole forward and
    forward+backward (ABBA) and the forward's kernel lists (:func:`ab_rounds_and_lists`)."""
    from nsa.ops._triton import compressed_fwd as module

    _pass2_sweep(T, config, PASS1_DESC)
    ab_rounds_and_lists(T, config, module.PASS2_APART, PASS1_DESC, "pass 1")


FORCED_PLACES = (("forced blocks in the window kernels (default)", {}),
                 ("forced blocks in their own kernels", {"NSA_FORCED_IN_WINDOW": "0"}))


def forced_place(T: int, config: NSAConfig) -> None:
    """The ``NSA_FORCED_IN_WINDOW`` flag on (default) and off: the whole forward and
    forward+backward in ABBA rounds and the forward's kernel lists (the flag is read at each call,
    so the environment is the launch table here)."""
    import os

    ab_rounds_and_lists(T, config, os.environ, FORCED_PLACES, "flag")


#: The compressed dK/dV's Gluon kernel off and on (session 61 on a branch; session 62's, in main and
#: on by default: 19.5 against 21.9 ms at 64k, the forward+backward about 2 ms shorter).
GLUON_DKDV = (("Triton dK/dV", {"NSA_GLUON_COMPRESSED_DKDV": "0"}),
              ("Gluon dK/dV", {"NSA_GLUON_COMPRESSED_DKDV": "1"}))


#: ``NSA_GLUON_SELECTED_DKDV`` off and on (session 63: the selected branch's dK/dV in Gluon).
GLUON_SELECTED_DKDV = (("Triton dK/dV", {"NSA_GLUON_SELECTED_DKDV": "0"}),
                       ("Gluon dK/dV", {"NSA_GLUON_SELECTED_DKDV": "1"}))


#: ``NSA_GLUON_WINDOW_DKDV`` off and on (the window branch's dK/dV in Gluon, written in session 63).
GLUON_WINDOW_DKDV = (("Triton dK/dV", {"NSA_GLUON_WINDOW_DKDV": "0"}),
                     ("Gluon dK/dV", {"NSA_GLUON_WINDOW_DKDV": "1"}))

#: ``NSA_GLUON_WINDOW_DQ`` off and on (the window branch's dQ in Gluon, written in session 64).
GLUON_WINDOW_DQ = (("Triton dQ", {"NSA_GLUON_WINDOW_DQ": "0"}), ("Gluon dQ", {"NSA_GLUON_WINDOW_DQ": "1"}))

#: ``NSA_GLUON_WINDOW_FWD`` off and on (the window branch's forward in Gluon, written in session 64).
GLUON_WINDOW_FWD = (("Triton forward", {"NSA_GLUON_WINDOW_FWD": "0"}),
                    ("Gluon forward", {"NSA_GLUON_WINDOW_FWD": "1"}))

#: ``NSA_GLUON_COMPRESSED_PASS1`` off and on (the compressed forward's pass 1 in Gluon, session 63).
GLUON_PASS1 = (("Triton pass 1", {"NSA_GLUON_COMPRESSED_PASS1": "0"}),
               ("Gluon pass 1", {"NSA_GLUON_COMPRESSED_PASS1": "1"}))

#: ``NSA_GLUON_COMPRESSED_SCORES`` off and on (the compressed forward's scoring pass in Gluon, session 67).
GLUON_SCORES = (("Triton pass 2", {"NSA_GLUON_COMPRESSED_SCORES": "0"}),
                ("Gluon pass 2", {"NSA_GLUON_COMPRESSED_SCORES": "1"}))


def step_ab_and_lists(T: int, config: NSAConfig, table: dict, variants: tuple, what: str) -> None:
    """The whole forward+backward in ABBA rounds (:func:`step_abba`) and its kernel lists
    (:func:`kernels_by_default`) with each of ``variants`` over the table ``table``."""
    step_abba(T, config, table, variants, what)
    kernels_by_default(T, config, table, variants, what)


def flag_ab(T: int, config: NSAConfig, variants: tuple, what: str) -> None:
    """A flag's ``variants`` (environments) through :func:`step_ab_and_lists`: flags are read at each
    call, so the environment is the launch table here."""
    import os

    step_ab_and_lists(T, config, os.environ, variants, what)


def gluon_dkdv(T: int, config: NSAConfig) -> None:
    """``NSA_GLUON_COMPRESSED_DKDV`` off and on (:func:`flag_ab`)."""
    flag_ab(T, config, GLUON_DKDV, "compressed")


def gluon_window_dkdv(T: int, config: NSAConfig) -> None:
    """``NSA_GLUON_WINDOW_DKDV`` off and on (:func:`flag_ab`)."""
    flag_ab(T, config, GLUON_WINDOW_DKDV, "window")


def gluon_window_dq(T: int, config: NSAConfig) -> None:
    """``NSA_GLUON_WINDOW_DQ`` off and on (:func:`flag_ab`)."""
    flag_ab(T, config, GLUON_WINDOW_DQ, "window")


def gluon_pass1(T: int, config: NSAConfig) -> None:
    """``NSA_GLUON_COMPRESSED_PASS1`` off and on: the forward and the forward+backward in ABBA rounds
    and the forward's kernel lists (:func:`ab_rounds_and_lists` over the environment)."""
    import os

    ab_rounds_and_lists(T, config, os.environ, GLUON_PASS1, "compressed")


def gluon_scores(T: int, config: NSAConfig) -> None:
    """``NSA_GLUON_COMPRESSED_SCORES`` off and on, as :func:`gluon_pass1`."""
    import os

    ab_rounds_and_lists(T, config, os.environ, GLUON_SCORES, "compressed")


def gluon_window_fwd(T: int, config: NSAConfig) -> None:
    """``NSA_GLUON_WINDOW_FWD`` off and on: the forward and the forward+backward in ABBA rounds and the
    forward's kernel lists (:func:`ab_rounds_and_lists` over the environment)."""
    import os

    ab_rounds_and_lists(T, config, os.environ, GLUON_WINDOW_FWD, "window")


def gluon_selected_dkdv(T: int, config: NSAConfig) -> None:
    """``NSA_GLUON_SELECTED_DKDV`` off and on (:func:`flag_ab`)."""
    flag_ab(T, config, GLUON_SELECTED_DKDV, "selected")


#: ``(label, file)`` of the Gluon modules that :func:`gluon_dkdv_variants` puts in place of main's
#: (``--dkdv-variant``), the branch whose module they replace (``--dkdv-branch``) and that module's
#: name (``--variant-module``: ``gluon_dkdv``, or the window's ``gluon_dq`` or ``gluon_fwd``).
DKDV_VARIANTS: List[Tuple[str, str]] = []
DKDV_BRANCH = "compressed"
VARIANT_MODULE = "gluon_dkdv"
#: The module whose globals name a variant module where that is not its branch's ``kernel`` (the
#: compressed forward's launcher calls pass 1's kernel), and the modules of forward kernels.
VARIANT_TABLES = {"gluon_pass1": "nsa.ops._triton.compressed_fwd"}
FORWARD_MODULES = ("gluon_fwd", "gluon_pass1")


def _module_from_file(name: str, path: str):
    """The Python file ``path`` imported as a module named ``name`` (not registered in ``sys.modules``)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gluon_dkdv_variants(T: int, config: NSAConfig) -> None:
    """Each :data:`DKDV_VARIANTS` module in place of main's :data:`VARIANT_MODULE` of the branch
    :data:`DKDV_BRANCH` (compressed, selected or window: its backward looks the module up at each call): its
    dq, dk, dv, dgates against main's on the same inputs and output gradient (relative error; a wrong
    version shows here before its times mean anything), then the whole forward+backward in ABBA rounds
    and the kernel lists."""
    import importlib

    from nsa.testing import rel_error

    kernel = importlib.import_module(VARIANT_TABLES.get(VARIANT_MODULE, f"nsa.ops.{DKDV_BRANCH}.kernel"))
    main = importlib.import_module(f"nsa.ops.{DKDV_BRANCH}.{VARIANT_MODULE}")

    variants = (("main", {VARIANT_MODULE: main}),) + tuple(
        (label, {VARIANT_MODULE: _module_from_file(f"{VARIANT_MODULE}_{label}", path)}) for label, path in DKDV_VARIANTS)
    q, k, v, gates, _ = inputs(T, T + 17, backward=True)
    run = training_step(q, k, v, gates, config)
    grads = {}
    for label, module in variants:
        with tiles_as_default(vars(kernel), **module):
            grads[label] = run()
    for label, _ in variants[1:]:
        errs = ", ".join(f"{name} {rel_error(b, a):.1e}" for name, a, b in zip(("dq", "dk", "dv", "dgates"),
                                                                               grads["main"], grads[label]))
        print(f"T={T} {DKDV_BRANCH} {VARIANT_MODULE} {label} against main: {errs}", flush=True)
    del grads
    if VARIANT_MODULE in FORWARD_MODULES:  # a forward kernel: the forward alone in ABBA rounds too
        step_abba(T, config, vars(kernel), variants, f"{DKDV_BRANCH} {VARIANT_MODULE}", forward=True)
    step_ab_and_lists(T, config, vars(kernel), variants, f"{DKDV_BRANCH} {VARIANT_MODULE}")


def gluon_selected_qseg(T: int, config: NSAConfig) -> None:
    """The selected dK/dV's queries a program (``BWD_TILES["dkdv"]["QSEG"]``; 0: 1024 at 64k) at 512,
    the default and 2048: the whole forward+backward (ABBA) and the kernel lists, with whatever
    ``NSA_GLUON_SELECTED_DKDV`` says."""
    variants = (("QSEG default", {"QSEG": 0}), ("QSEG 512", {"QSEG": 512}), ("QSEG 2048", {"QSEG": 2048}))
    step_ab_and_lists(T, config, BWD_TILES["dkdv"], variants, "selected dK/dV")


def pass2_wide(T: int, config: NSAConfig) -> None:
    """:func:`_pass2_sweep` over :data:`PASS2_WIDE` (wider query tiles than the default's), then the
    default against the fused launch in the whole forward and forward+backward (ABBA) and the
    forward's kernel lists."""
    from nsa.ops._triton import compressed_fwd as module

    _pass2_sweep(T, config, PASS2_WIDE)
    variants = PASS2_WIDE[:2]
    ab_rounds_and_lists(T, config, module.PASS2_APART, variants, "pass 2")


def ab_rounds_and_lists(T: int, config: NSAConfig, table: dict, variants: tuple, what: str) -> None:
    """The A/B of a launch table's variants that every section of sessions 55-56 ran: the forward and
    the whole forward+backward in ABBA rounds (:func:`step_abba`), then the forward's kernel lists
    (:func:`kernels_by_default`)."""
    step_abba(T, config, table, variants, what, forward=True)
    step_abba(T, config, table, variants, what)
    kernels_by_default(T, config, table, variants, what, forward=True)


def kernels_by_default(T: int, config: NSAConfig, table: dict, variants: tuple, what: str,
                       forward: bool = False) -> None:
    """:func:`kernel_times` (the mean of 5 steps; with ``forward`` :func:`forward_kernel_times`) with
    each ``(label, tiles)`` of ``variants`` over the launch table ``table`` in turn, twice."""
    for _ in range(2):
        for label, tiles in variants:
            print(f"T={T} {what} {label}:", flush=True)
            with tiles_as_default(table, **tiles):
                (forward_kernel_times if forward else kernel_times)(T, config, steps=5)


def step_abba(T: int, config: NSAConfig, table: dict, variants: tuple, what: str, forward: bool = False) -> None:
    """The whole ``nsa_attention`` forward+backward (with ``forward`` the forward under ``no_grad``)
    with each ``(label, tiles)`` of ``variants`` over the launch table ``table``, four rounds, every
    other one in reverse (ABBA: in session 54's first A/Bs the variant measured first in each round
    was the slower, whichever it was): ``do_bench`` (L2 flushed before each call) and 5 calls back
    to back without a flush (CUDA events around them)."""
    q, k, v, gates, _ = inputs(T, T + 15, backward=True)
    run = forward_call(q, k, v, gates, config) if forward else training_step(q, k, v, gates, config)
    step = "fwd" if forward else "fwd+bwd"
    for turn in range(4):
        for label, tiles in variants[:: 1 if turn % 2 == 0 else -1]:
            with tiles_as_default(table, **tiles):
                flushed = bench(run)
                run()
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                e0.record()
                for _ in range(5):
                    run()
                e1.record()
                e1.synchronize()
            print(f"T={T} nsa {step}, {what} {label}: {flushed:.3f} ms flushed, "
                  f"{e0.elapsed_time(e1) / 5:.3f} back to back", flush=True)


def _composed_training(q, k, v, gates, config: NSAConfig) -> torch.Tensor:
    """``nsa_attention`` as the ops' own autograd Functions (the training path before
    :mod:`nsa.ops.training`)."""
    from nsa.ops.combine import composed_branches

    return composed_branches(q, k, v, gates, mean_compress(k, config), mean_compress(v, config), k, v, config, 0,
                             "triton")[0]


class _Session10Training(torch.autograd.Function):
    """The training Function with session 10's plumbing, from today's launchers: the window then
    the gates kernel forward; backward, the gates' kernel writes the three ``g * do`` copies (and
    the deltas), which the branch backwards read. Same launches and bytes as that code; its
    deltas are today's (``rowsum(o * do)``), so only its times are meaningful."""

    @staticmethod
    def forward(ctx, q, k, v, k_cmp, v_cmp, gates, config):
        from nsa.ops._triton.compressed_fwd import compressed_fwd
        from nsa.ops.gates.kernel import gates_fwd
        from nsa.ops.window.kernel import window_fwd

        scale, forced = config.softmax_scale(q.shape[-1]), (config.init_blocks, config.local_blocks)
        o_cmp, lse_cmp, idx = compressed_fwd(q, k_cmp, v_cmp, config, scale, 0, select=True)
        o_slc, lse_slc = selected_fwd(q, k, v, idx, config.sel_block, scale, 0, forced=forced)
        o_win, lse_win = window_fwd(q, k, v, config.window, scale, 0)
        ctx.save_for_backward(q, k, v, k_cmp, v_cmp, gates, idx, o_cmp, lse_cmp, o_slc, lse_slc, o_win, lse_win)
        ctx.config, ctx.scale, ctx.forced = config, scale, forced
        return gates_fwd(gates, o_cmp, o_slc, o_win)

    @staticmethod
    def backward(ctx, do):
        from nsa.ops.compressed.kernel import compressed_bwd
        from nsa.ops.gates.kernel import gates_bwd
        from nsa.ops.window.kernel import window_bwd

        q, k, v, k_cmp, v_cmp, gates, idx, o_cmp, lse_cmp, o_slc, lse_slc, o_win, lse_win = ctx.saved_tensors
        config, scale = ctx.config, ctx.scale
        dgates, d_cmp, d_slc, d_win, delta = gates_bwd(gates, o_cmp, o_slc, o_win, do.contiguous(), with_delta=True)
        dq, dk_cmp, dv_cmp = compressed_bwd(q, k_cmp, v_cmp, o_cmp, lse_cmp, d_cmp, None, config, scale, 0,
                                            delta=delta[0])
        _, dk, dv = selected_bwd(q, k, v, idx, o_slc, lse_slc, d_slc, config.sel_block, scale, 0, forced=ctx.forced,
                                 delta=delta[1], dq=dq)
        _, dk_win, dv_win = window_bwd(q, k, v, o_win, lse_win, d_win, config.window, scale, 0, delta=delta[2], dq=dq)
        return dq, dk.add_(dk_win), dv.add_(dv_win), dk_cmp, dv_cmp, dgates, None


def training_ab(T: int, config: NSAConfig) -> None:
    """The training step as one autograd Function against the composed ops and against session
    10's plumbing (``_Session10Training``): forward and forward+backward times (three
    times, interleaved, in one process), and the gradients' relative differences to the composed ops."""
    q, k, v, gates, _ = inputs(T, T + 20, backward=True)
    leaves = [q, k, v, gates]
    one = lambda: nsa_attention(q, k, v, gates, config, backend="triton")
    composed = lambda: _composed_training(q, k, v, gates, config)
    session10 = lambda: _Session10Training.apply(q, k, v, mean_compress(k, config), mean_compress(v, config), gates,
                                                 config)
    runs = {"one function": (one, fwd_bwd(one, leaves)), "composed ops": (composed, fwd_bwd(composed, leaves)),
            "session 10 plumbing": (session10, fwd_bwd(session10, leaves))}
    for _ in range(3):
        for name, (fwd, step) in runs.items():
            print(f"T={T} training, {name}: fwd {bench(fwd):.3f} ms, fwd+bwd {bench(step):.3f} ms", flush=True)
    from nsa.testing import rel_error

    grad = torch.randn_like(one())
    got = torch.autograd.grad(one(), leaves, grad)
    want = torch.autograd.grad(composed(), leaves, grad)
    errs = ", ".join(f"{name} {rel_error(a, b):.1e}" for name, a, b in zip(("dq", "dk", "dv", "dgates"), got, want))
    print(f"T={T} training, one function against composed: {errs}", flush=True)


def gate_ab(T: int, config: NSAConfig) -> None:
    """Training's launches with the gates applied inside the branch kernels against the stored
    ``g * do`` copies (session 11), piece by piece: the gates' backward with and without the
    copies, each branch backward from its copy (delta given) against from ``do`` and its gate,
    and the forward's window launch writing the gated sum beside its own output against the
    window launch then the gates kernel. Relative differences against the first of each pair."""
    from nsa.ops._triton.compressed_fwd import compressed_fwd
    from nsa.ops.compressed.kernel import compressed_bwd
    from nsa.ops.gates.kernel import gates_bwd, gates_fwd
    from nsa.ops.selected.kernel import selected_bwd
    from nsa.ops.window.kernel import window_bwd, window_fwd, window_fwd_summed
    from nsa.testing import rel_error

    q, k, v, gates, do = inputs(T, T + 21, backward=True)
    k_cmp, v_cmp = mean_compress(k, config), mean_compress(v, config)
    scale, forced = config.softmax_scale(D), (config.init_blocks, config.local_blocks)
    o_cmp, lse_cmp, idx = compressed_fwd(q, k_cmp, v_cmp, config, scale, 0, select=True)
    o_slc, lse_slc = selected_fwd(q, k, v, idx, config.sel_block, scale, 0, forced=forced)
    o_win, lse_win = window_fwd(q, k, v, config.window, scale, 0)
    outs = (o_cmp, o_slc, o_win)

    def pair(label, before, after):
        a, b = before(), after()
        a, b = (a,) if torch.is_tensor(a) else a, (b,) if torch.is_tensor(b) else b
        errs = ", ".join(f"{rel_error(y, x):.1e}" for x, y in zip(a, b) if x is not None and y is not None)
        print(f"T={T} {label}: before {bench(before):.3f} ms, after {bench(after):.3f} ms, "
              f"before {bench(before):.3f} ms (relative differences {errs})", flush=True)

    pair("training forward: window then gates kernel / window writing the sum",
         lambda: (gates_fwd(gates, o_cmp, o_slc, window_fwd(q, k, v, config.window, scale, 0)[0]),),
         lambda: window_fwd_summed(q, k, v, config.window, scale, 0, gates, o_cmp, o_slc)[:1])
    pair("gates backward: with the three g * do copies / without",
         lambda: gates_bwd(gates, *outs, do, with_delta=True)[:1],
         lambda: gates_bwd(gates, *outs, do, with_delta=True, store_do=False)[:1])
    _, *copies, _ = gates_bwd(gates, *outs, do)
    delta = gates_bwd(gates, *outs, do, with_delta=True, store_do=False)[4]
    own_delta = [attn_bwd_delta(o, d) for o, d in zip(outs, copies)]
    g32 = gates.float().permute(3, 0, 1, 2).contiguous()  # [3, B, T, HQ]: each branch's gates, unit stride
    ln_g = g32.log()  # the gates fold into lse where they are positive: g p = exp(s - (lse - ln g))
    lse_fold = (lse_cmp - ln_g[0], lse_slc - ln_g[1] * LOG2E, lse_win - ln_g[2] * LOG2E)  # natural, log2, log2
    branches = {
        "compressed": lambda d, lse, delta_i, **kw: compressed_bwd(q, k_cmp, v_cmp, o_cmp, lse, d, None, config, scale,
                                                                   0, delta=delta_i, **kw),
        "selected": lambda d, lse, delta_i, **kw: selected_bwd(q, k, v, idx, o_slc, lse, d, config.sel_block, scale, 0,
                                                               forced=forced, delta=delta_i, **kw),
        "window": lambda d, lse, delta_i, **kw: window_bwd(q, k, v, o_win, lse, d, config.window, scale, 0,
                                                           delta=delta_i, **kw),
    }
    lses = (lse_cmp, lse_slc, lse_win)
    for i, (name, run) in enumerate(branches.items()):
        variants = {
            "from its g * do copy": lambda: run(copies[i], lses[i], own_delta[i]),
            "from do, gate float32 unit stride": lambda: run(do, lses[i], delta[i], gate=g32[i]),
            "from do, gate folded into lse": lambda: run(do, lse_fold[i], delta[i]),
        }
        first = None
        for label, fn in variants.items():
            out = fn()
            first = first or out
            errs = ", ".join(f"{rel_error(a, b):.1e}" for a, b in zip(out, first))
            print(f"T={T} {name} backward {label}: {bench(fn):.3f} ms (against the first: {errs})", flush=True)
        print(f"T={T} {name} backward {next(iter(variants))} again: {bench(next(iter(variants.values()))):.3f} ms",
              flush=True)


#: how many of the longest kernels ``kernel_times`` lists (``--kernels``)
KERNELS_LISTED = 16


def kernel_times(T: int, config: NSAConfig, steps: int = 1) -> None:
    """Device time of every kernel of ``nsa_attention``'s forward+backward (torch profiler, after two
    warm-up calls, the mean of ``steps``), largest first."""
    q, k, v, gates, _ = inputs(T, T + 15, backward=True)
    run = training_step(q, k, v, gates, config)
    _list_kernels(T, "forward+backward", run, steps)


def forward_kernel_times(T: int, config: NSAConfig, steps: int = 1) -> None:
    """As :func:`kernel_times`, for the forward under ``no_grad`` (what the tables' forward column
    times)."""
    q, k, v, gates = inputs(T, T + 15)
    _list_kernels(T, "forward (no_grad)", forward_call(q, k, v, gates, config), steps)


def _list_kernels(T: int, what: str, run: Callable[[], object], steps: int = 1,
                  kernel: Optional[str] = None) -> Optional[float]:
    """Device time of every kernel of ``run()`` (torch profiler, after two warm-up calls), largest
    first: the mean over ``steps`` calls profiled back to back. Returns the mean ms of the kernel
    named ``kernel`` (None: of none)."""
    from torch.profiler import ProfilerActivity, profile

    run(), run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            run()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.self_device_time_total > 0]
    events.sort(key=lambda e: e.self_device_time_total, reverse=True)
    total = sum(e.self_device_time_total for e in events) / 1e3 / steps
    mean = f"the mean of {steps} " if steps > 1 else "one "
    print(f"T={T} kernels of {mean}{what}: {total:.3f} ms in all", flush=True)
    for e in events[:KERNELS_LISTED]:
        print(f"T={T}   {e.self_device_time_total / 1e3 / steps:8.3f} ms  x{e.count // steps:<3d} {e.key[:90]}",
              flush=True)
    return next((e.self_device_time_total / 1e3 / steps for e in events if e.key == kernel), None)


def _ptx_counts(fn) -> List[str]:
    """Per compiled variant of the Triton function ``fn``: counts of a few float32 instructions."""
    out = []
    for cache in fn.device_caches.values():
        kernels = cache[0] if isinstance(cache, tuple) else cache
        for compiled in kernels.values():
            ptx = compiled.asm.get("ptx", "")
            counts = {op: ptx.count(op) for op in ("fma.rn.f32", "mul.f32", "mul.rn.f32", "add.f32", "add.rn.f32",
                                                   "div.full.f32", "div.rn.f32", "rcp.")}
            out.append(f"{getattr(compiled, 'name', '?')}: {counts}")
    return out


def gated_bits(T: int, config: NSAConfig) -> None:
    """Why the inference gated sum (window kernel epilogue) and the two launches (window, then
    the gates kernel) can differ: both against float32 sums emulated in float64, with and without
    a fused multiply-add, from the stored window output; then the kernels' float32 instructions."""
    from nsa.ops.gates.kernel import gates_fwd_kernel
    from nsa.ops import combine_branches
    from nsa.ops.window import kernel as win

    for dtype, t, hq, h, d in ((torch.float32, 83, 4, 2, 16), (torch.float32, T, 64, 4, 128), (torch.bfloat16, T, 64, 4, 128)):
        torch.manual_seed(t + 17)
        q = torch.randn(1, t, hq, d, device=DEV, dtype=dtype)
        k, v = torch.randn(1, t, h, d, device=DEV, dtype=dtype), torch.randn(1, t, h, d, device=DEV, dtype=dtype)
        gates = torch.rand(1, t, hq, 3, device=DEV, dtype=dtype)
        o_cmp, o_slc = torch.randn_like(q), torch.randn_like(q)
        scale = config.softmax_scale(d)
        with torch.no_grad():
            o_win, _ = win.window_fwd(q, k, v, config.window, scale, 0)
            two = combine_branches(gates, o_cmp, o_slc, o_win, backend="triton")
            fused = win.window_fwd(q, k, v, config.window, scale, 0, gated=(gates, o_cmp, o_slc))[0]
        g = gates.double()
        f32 = lambda x: x.float().double()
        p1 = f32(g[..., 0:1] * o_cmp.double())
        e_fma = f32(g[..., 2:3] * o_win.double() + f32(g[..., 1:2] * o_slc.double() + p1))
        e_plain = f32(f32(p1 + f32(g[..., 1:2] * o_slc.double())) + f32(g[..., 2:3] * o_win.double()))
        e_fma, e_plain = e_fma.to(dtype), e_plain.to(dtype)
        n = lambda a, b: int((a != b).sum())
        print(f"gated bits {dtype} T={t} HQ={hq} D={d}: fused!=two {n(fused, two)}, two!=fma {n(two, e_fma)}, "
              f"two!=plain {n(two, e_plain)}, fused!=fma {n(fused, e_fma)}, fused!=plain {n(fused, e_plain)} "
              f"of {fused.numel()}", flush=True)
    for line in _ptx_counts(win.window_fwd_kernel) + _ptx_counts(gates_fwd_kernel):
        print(f"ptx {line}", flush=True)


#: Launches of the compressed forward with selection (``compressed_fwd`` keyword arguments); the
#: first is session 19's. Session 20 measured (H100, ms; ``raw/session20_cmp_fwd*``): pass-2 blocks
#: a step / pass-1 token tile / stages / maxnreg (32, 64, 3, -) 0.472 at 8k, 1.418 at 16k, 4.878 at
#: 32k, 18.36 at 64k; (16, 32, 2, 128) 0.394, 1.308, 4.868, 19.14; (16, 32, 3, -) 0.418, 1.346,
#: 4.913, 18.87; (16, 32, 2, -) 1.374 at 16k, 5.116 at 32k; (32, 32, 2, 128) 0.483, 1.622, 5.766;
#: (16, 64, 2, -) 0.455 at 8k, 19.93 at 64k; score buffers of 1 and 2 GiB (fewer query chunks)
#: 18.69 and 19.24 at 64k. Hence SHORT_TILES for calls whose walks are all short.
#: The top-n inside the compressed program (``attempts/prefill_topn_in_compressed_fwd.patch``) took
#: 0.585 / 1.807 / 5.590 / 20.16 ms at 8k / 16k / 32k / 64k against 0.476 / 1.420 / 4.807 / 18.34.
#: Session 23 (``raw/session23_cmp_fwd_rows_h100.txt``): 8 query positions a program (128 rows, two
#: warp groups, reading each key tile once for twice the rows) in four launches (64- or 32-token
#: tiles, 2 or 3 stages, 16 blocks a step) and session 19's wide 64-row tiles: none faster.
#: Now (session 24): the score buffer, hence the query chunks (256 MB, the default: 8 chunks at 64k).
#: Session 20 found fewer chunks slower (1 and 2 GiB); smaller buffers are also more launches, but
#: a chunk's masses then stay in L2 for its top-n.
CMP_FWD_SWEEP = (("default (256 MB score buffer)", {}),) + tuple(
    (f"{mb} MB score buffer", dict(score_buffer_bytes=mb * 2**20)) for mb in (128, 64, 32, 16))


def cmp_fwd_variants(T: int, config: NSAConfig) -> None:
    """The compressed forward with selection by launch (:data:`CMP_FWD_SWEEP`), each checked against
    the first (``o`` and ``lse`` bitwise, the share of equal ``block_idx`` rows: other tiles sum the
    masses in another order), and the registers and shared memory of each compiled variant."""
    from nsa.ops._triton import compressed_fwd as module

    q, k, v, _ = inputs(T, T + 4)
    k_cmp, v_cmp = mean_compress(k, config), mean_compress(v, config)
    scale = config.softmax_scale(D)
    first = None
    for label, launch in CMP_FWD_SWEEP:
        call = lambda: module.compressed_fwd(q, k_cmp, v_cmp, config, scale, 0, select=True, **launch)
        out = call()
        first = first or out
        same = all(torch.equal(a, b) for a, b in zip(out[:2], first[:2]))
        rows = (out[2] == first[2]).all(-1).float().mean().item()
        print(f"T={T} compressed + selection, {label}: {bench(call):.3f} ms (o, lse bitwise equal to the first: "
              f"{same}; equal block rows {rows:.5f})", flush=True)
    print(f"T={T} compressed forward kernels compiled: {'; '.join(resources(module.compressed_fwd_kernel))}", flush=True)


def cmp_fwd_parts(T: int, config: NSAConfig) -> None:
    """The compressed forward by what it computes: ``o`` and ``lse`` (pass 1 alone), block masses
    alone (pass 1 without ``p @ v``, then pass 2), both; the difference of the last two is what
    ``p @ v`` adds, that of the first two what pass 2 costs beyond an ``lse``-only pass 1."""
    from nsa.ops._triton.compressed_fwd import compressed_fwd

    q, k, v, _ = inputs(T, T + 4)
    k_cmp, v_cmp = mean_compress(k, config), mean_compress(v, config)
    scale = config.softmax_scale(D)
    for store_o, select in ((True, False), (False, True), (True, True)):
        call = lambda: compressed_fwd(q, k_cmp, v_cmp, config, scale, 0, store_o=store_o, select=select)
        print(f"T={T} compressed forward, o {store_o}, selection {select}: {bench(call):.3f} ms", flush=True)


def pass1_rate(T: int, config: NSAConfig) -> None:
    """The compressed forward's pass 1 where pass 2 runs apart (the first ``compressed_fwd_kernel``
    of each call: pass 1 runs once over every query, then each chunk's pass 2), from the torch
    profiler over 5 calls, with its rate in TFLOP/s of useful work (``q k`` and ``p v`` over each
    query's visible compressed tokens): against the specialised Gluon loop's 549-607 TFLOP/s
    (session 61), how much a Gluon pass 1 could gain."""
    from torch.profiler import ProfilerActivity, profile

    from nsa.ops._triton.compressed_fwd import compressed_fwd

    q, k, v, _ = inputs(T, T + 4)
    k_cmp, v_cmp = mean_compress(k, config), mean_compress(v, config)
    scale = config.softmax_scale(D)
    call = lambda: compressed_fwd(q, k_cmp, v_cmp, config, scale, 0, store_o=True, select=True)
    call(), call()
    torch.cuda.synchronize()
    calls = 5
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    launches = sorted((e for e in prof.events() if e.name == "compressed_fwd_kernel" and e.device_type.name == "CUDA"),
                      key=lambda e: e.time_range.start)
    per_call = len(launches) // calls
    if per_call < 2:  # pass 2 not apart (short walks, or a GPU where the Hopper tiles do not fit)
        print(f"T={T} compressed pass 1: not apart ({len(launches)} launches in {calls} calls)", flush=True)
        return
    pass1 = [launches[i * per_call].time_range.elapsed_us() / 1e3 for i in range(calls)]
    rest = sum(e.time_range.elapsed_us() for e in launches) / 1e3 / calls - statistics.mean(pass1)
    visible = sum(config.num_cmp(t + 1) for t in range(T))  # spec Nc(t) summed over the queries
    flops = 4.0 * D * visible * q.shape[2]
    ms = statistics.median(pass1)
    print(f"T={T} compressed pass 1: {ms:.3f} ms (median of {calls}; {min(pass1):.3f}-{max(pass1):.3f}), "
          f"{flops / ms / 1e9:.1f} TFLOP/s; its {per_call - 1} pass-2 launches {rest:.3f} ms", flush=True)


def topn_variants(T: int, config: NSAConfig) -> None:
    """The top-n kernel on every query chunk of length ``T`` by rows per program and warps
    (random masses: its work does not depend on the values; session 13 also measured 2 rows a
    program with 1 or 2 warps, 4 with 4 and 8 with 8 on the first and last chunk at 64k: none
    faster)."""
    from nsa.ops._triton.block_topn import block_topn, block_topn_kernel
    from nsa.ops._triton.compressed_fwd import SCORE_BUFFER_BYTES, _score_geometry, query_chunk

    H, planes, nsel = 4, _score_geometry(config)["NSPILL"], config.num_sel_blocks(T)
    chunk = query_chunk(1, T, H, planes * nsel, 4, SCORE_BUFFER_BYTES)
    scores = torch.rand(1, chunk, H, planes, nsel, device=DEV)
    idx = torch.empty(1, T, H, config.sel_count, dtype=torch.int32, device=DEV)
    for t0 in range(0, T, chunk):
        first = None
        for br, warps in ((1, 1), (1, 2), (1, 4)):
            call = lambda: block_topn(scores, idx, t0, t0, config.sel_block, config.init_blocks, config.local_blocks,
                                      rows_per_program=br, num_warps=warps)
            call()
            out = idx[:, t0:t0 + chunk].clone()
            first = out if first is None else first
            print(f"T={T} top-n of queries {t0}..{t0 + chunk - 1}, {br} rows a program, {warps} warps: "
                  f"{bench(call):.3f} ms (equal: {torch.equal(out, first)})", flush=True)
    print(f"T={T} top-n kernels compiled: {'; '.join(resources(block_topn_kernel))}", flush=True)


#: (BQ, warps) of the selected forward and dQ tried by ``sel_tiles`` (BQ query positions a program)
#: (session 13, random lists, H100: BQ 2 with 1 or 4 warps and BQ 4 with 8 were slower still than
#: these; so was a split of the tiles between a BQ-4 launch and a BQ-1 one by their share of
#: blocks held in common, docs/perf/prefill.md)
FWD_TILE_SWEEP = ((1, 1), (2, 2), (4, 4))
DQ_TILE_SWEEP = ((1, 2), (2, 2), (4, 4))


def sel_tiles(T: int, config: NSAConfig) -> None:
    """The selected forward and dQ by query positions a program (``BQ``) and warps, on the real
    selection: each block that a tile's queries hold is loaded once. Relative differences
    against one query a program; then one query a program against the saved copy of the
    previous kernels (``scripts/_old_selected_kernel.py``), bitwise."""
    c = selected_case(T, config, T + 1)
    q, k, v, idx, scale, forced, lse, do, delta = c.q, c.k, c.v, c.idx, c.scale, c.forced, c.lse, c.do, c.delta
    alike = idx[:, torch.arange(T, device=DEV) // 4 * 4]
    half = torch.where(torch.arange(idx.shape[-1], device=DEV) % 2 == 0, alike, idx)  # every other entry shared
    half = half.sort(-1).values
    for label, lists in (("random", idx), ("4 neighbours alike", alike), ("4 neighbours half alike", half)):
        _sel_tiles(T, config, c, lists.contiguous(), label)
    old = _previous("selected_kernel")
    if old is None:
        return
    import nsa.ops.selected.kernel as new

    def version(module):
        fwd = lambda: module.selected_fwd(q, k, v, idx, config.sel_block, scale, 0, forced=forced)
        dq = lambda: module.selected_bwd_dq(q, k, v, idx, do, lse, delta, config.sel_block, scale, 0,
                                            dict(module.BWD_TILES["dq"]), forced)
        return (lambda: (*fwd(), dq())), (fwd, dq)

    compare_versions(T, "selected forward / dQ", "o, lse, dq", old, new, version)


def _sel_tiles(T: int, config: NSAConfig, c: SimpleNamespace, idx: torch.Tensor, label: str) -> None:
    from nsa.testing import rel_error

    q, k, v, scale, forced, do, delta = c.q, c.k, c.v, c.scale, c.forced, c.do, c.delta
    lse = selected_fwd(q, k, v, idx, config.sel_block, scale, 0, forced=forced)[1]
    first = None
    for bq, warps in FWD_TILE_SWEEP:
        fn = lambda: selected_fwd(q, k, v, idx, config.sel_block, scale, 0, tiles=dict(BQ=bq, num_warps=warps),
                                  forced=forced)
        out = fn()
        first = first or out
        print(f"T={T} {label} lists: selected fwd BQ {bq}, {warps} warps: {bench(fn):.3f} ms "
              f"(o against BQ 1: {rel_error(out[0], first[0]):.1e})", flush=True)
    first = None
    for bq, warps in DQ_TILE_SWEEP:
        cfg = dict(BWD_TILES["dq"], BQ=bq, num_warps=warps)
        fn = lambda: selected_bwd_dq(q, k, v, idx, do, lse, delta, config.sel_block, scale, 0, cfg, forced)
        out = fn()
        first = out if first is None else first
        print(f"T={T} {label} lists: selected dQ BQ {bq}, {warps} warps: {bench(fn):.3f} ms "
              f"(against BQ 1: {rel_error(out, first):.1e})", flush=True)


def dq_from_ds(T: int, config: NSAConfig) -> None:
    """The selected backward with its dQ from the dK/dV kernel's ``dS`` (``NSA_SELECTED_DQ_FROM_DS_MIB``)
    against the dQ recomputing its softmax: the whole branch backward by the dS kernel's warps and
    loads (errors against the recomputing path), each kernel alone, then the whole
    ``nsa_attention`` forward+backward with the buffer allowed or not, twice each in turn."""
    import os

    from nsa.ops.selected import kernel as sel

    c = selected_case(T, config, T + 13)
    q, k, v, scale = c.q, c.k, c.v, c.scale
    args = (q, k, v, c.idx, c.o, c.lse, c.do, config.sel_block, scale, 0)
    os.environ["NSA_SELECTED_DQ_FROM_DS_MIB"] = "0"
    first, _ = timed_variant(T, "selected backward, dQ recomputing", lambda: sel.selected_bwd(
        *args, forced=c.forced, delta=c.delta), None)
    os.environ["NSA_SELECTED_DQ_FROM_DS_MIB"] = str(1 << 20)
    for warps, desc in ((1, False), (2, False), (4, False), (1, True), (2, True)):
        tiles = {"dq_ds": dict(num_warps=warps, KV_DESC=desc)}
        timed_variant(T, f"selected backward, dQ from dS ({warps} warps, {'copies' if desc else 'loads'})",
                      lambda: sel.selected_bwd(*args, forced=c.forced, delta=c.delta, tiles=tiles), first)
    cfg = {kind: dict(sel.BWD_TILES[kind]) for kind in sel.BWD_TILES}
    ds = sel.ds_buffer(q, c.idx, config.sel_block, cfg["dq"])
    dkdv = lambda keep: sel.selected_bwd_dkdv(q, k, v, c.idx, c.do, c.lse, c.delta, config.sel_block, scale, 0,
                                              cfg["dkdv"], None, 0, ds if keep else None)
    print(f"T={T} selected dK/dV alone: {bench(lambda: dkdv(False)):.3f} ms, leaving dS "
          f"{bench(lambda: dkdv(True)):.3f} ms", flush=True)
    dq = lambda keep: sel.selected_bwd_dq(q, k, v, c.idx, c.do, c.lse, c.delta, config.sel_block, scale, 0,
                                          cfg["dq"], c.forced, ds=ds if keep else None)
    print(f"T={T} selected dQ alone (forced kernel included): recomputing {bench(lambda: dq(False)):.3f} ms, "
          f"from dS {bench(lambda: dq(True)):.3f} ms", flush=True)
    del ds
    _whole_op_with_buffer(T, config, "NSA_SELECTED_DQ_FROM_DS_MIB", "dS buffer")


def _whole_op_with_buffer(T: int, config: NSAConfig, flag: str, what: str) -> None:
    """The whole ``nsa_attention`` forward+backward with the dQ-from-dS buffer of ``flag`` off and
    on (1 TiB allowed), twice each in turn so that drift shows; the flag is unset afterwards."""
    import os

    x, kk, vv, gates, _ = inputs(T, T + 7, backward=True)
    run = training_step(x, kk, vv, gates, config)
    for rnd in (1, 2):
        for mib in ("0", str(1 << 20)):
            os.environ[flag] = mib
            print(f"T={T} nsa_attention forward+backward, {what} {'off' if mib == '0' else 'on'} (round {rnd}): "
                  f"{bench(run):.3f} ms", flush=True)
    del os.environ[flag]


#: ``(block_n, num_warps, num_stages)`` of the compressed dQ from ``dS`` tried by ``cmp_dq_ds`` (one
#: query tile a program); the first was the default (``DQ_DS_TILES``) until session 57
CMP_DQ_DS_SWEEP = ((64, 4, 3), (64, 4, 2), (128, 4, 2), (128, 8, 2), (32, 4, 3))


def _compressed_training_case(T: int, config: NSAConfig) -> tuple:
    """``(q, k_cmp, v_cmp, o, lse, do, delta, gate, scale)``: the compressed branch at length ``T`` as
    training's backward sees it (``delta = rowsum(o * do)`` and a float32 gate), seeded."""
    from nsa.ops._triton.compressed_fwd import compressed_fwd

    q, k, v, _ = inputs(T, T + 19)
    k_cmp, v_cmp = mean_compress(k, config), mean_compress(v, config)
    scale = config.softmax_scale(D)
    o, lse, _ = compressed_fwd(q, k_cmp, v_cmp, config, scale, 0)
    do = torch.randn_like(o)
    gate = torch.rand(q.shape[:3], device=DEV, dtype=torch.float32)
    return q, k_cmp, v_cmp, o, lse, do, attn_bwd_delta(o, do), gate, scale


def cmp_dq_from_ds(T: int, config: NSAConfig) -> None:
    """The compressed backward as training calls it (``delta`` and a gate given) with its dQ from the
    dK/dV kernel's ``dS`` (``NSA_COMPRESSED_DQ_FROM_DS_MIB``) against the dQ recomputing the scores:
    the whole branch backward by the dQ's tiles (errors against the recomputing path), the buffer's
    size, then the whole ``nsa_attention`` forward+backward with the buffer allowed or not, twice
    each in turn."""
    import os

    from nsa.ops.compressed import kernel as cmp

    q, k_cmp, v_cmp, o, lse, do, delta, gate, scale = _compressed_training_case(T, config)
    call = lambda tiles=None: cmp.compressed_bwd(q, k_cmp, v_cmp, o, lse, do, None, config, scale, 0, delta=delta,
                                                 gate=gate, dq_ds=tiles)
    os.environ["NSA_COMPRESSED_DQ_FROM_DS_MIB"] = "0"
    first, _ = timed_variant(T, "compressed backward, dQ recomputing", call, None)
    os.environ["NSA_COMPRESSED_DQ_FROM_DS_MIB"] = str(1 << 20)
    kv = dict(BT=64 // 16, GP=16, BN=cmp.DKDV_TILES["tiles"][1])
    ds = cmp._ds_buffer(q, k_cmp, config, 0, kv, None)
    if ds is not None:
        print(f"T={T} compressed dS buffer: {ds['buffer'].numel() * ds['buffer'].element_size() / 2**30:.2f} GiB",
              flush=True)
    del ds
    for tiles in CMP_DQ_DS_SWEEP:
        timed_variant(T, f"compressed backward, dQ from dS {tiles}", lambda: call(tiles), first)
    _whole_op_with_buffer(T, config, "NSA_COMPRESSED_DQ_FROM_DS_MIB", "compressed dS buffer")


#: ``(rows, block_n, warps, stages, max_splits)`` of the compressed dK/dV kernel tried by
#: ``cmp_dkdv_ds`` with the dQ from its ``dS``; the first is the default (``DKDV_TILES``), chosen on
#: an H100 (session 12) before the dK/dV kernel stored ``dS`` (session 19). Session 53 (H200, one
#: timing each, ms at 8k / 64k): the default 0.681 / 27.75; 2 stages 0.811 / 33.11; split cap 16
#: 0.823 / 27.91, 64 0.661 / 28.03; (64, 64, 4, 3) 0.880 / 38.86; (64, 64, 4, 2) 0.709 / 29.44;
#: (128, 128, 8, 2) 2.371 / 97.84; (128, 64, 8, 3) out of shared memory. Session 54 adds 32-row query
#: tiles: compiled for sm_90 they hold 226 registers and spill none, the default 255 and 16 bytes.
CMP_DKDV_DS_SWEEP = ((64, 128, 8, 3, 32), (32, 128, 8, 3, 32), (32, 128, 8, 4, 32), (32, 128, 8, 2, 32),
                     (32, 128, 8, 3, 64), (64, 128, 8, 3, 64))


def cmp_dkdv_with_ds(T: int, config: NSAConfig) -> None:
    """The compressed backward as training calls it where the ``dS`` buffer fits (the dK/dV kernel
    stores ``dS`` and the dQ reads it) by the dK/dV kernel's tiles and query chunks
    (:data:`CMP_DKDV_DS_SWEEP`), dq, dk and dv against the first variant's; where another variant is
    the fastest, the whole ``nsa_attention`` forward+backward with it and with the default as the
    default, in turn. ``cmp_dkdv`` sweeps the same kernel without ``dS``, as it runs where the buffer
    does not fit."""
    import os
    from unittest import mock

    from nsa.ops.compressed import kernel as cmp

    q, k_cmp, v_cmp, o, lse, do, delta, gate, scale = _compressed_training_case(T, config)
    first = None
    # the buffer allowed whatever its size; the environment as it was afterwards
    times = {}
    with mock.patch.dict(os.environ, {"NSA_COMPRESSED_DQ_FROM_DS_MIB": str(1 << 20)}):
        for *tiles, cap in CMP_DKDV_DS_SWEEP:
            call = lambda: cmp.compressed_bwd(q, k_cmp, v_cmp, o, lse, do, None, config, scale, 0, delta=delta,
                                              gate=gate, dkdv=tuple(tiles), max_splits=cap)  # fmt: skip
            first, ms = timed_variant(T, f"compressed backward with dS, dK/dV {tiles} splits<={cap}", call, first)
            if ms is not None:
                times[(*tiles, cap)] = ms
    best = min(times, key=times.get)
    if best != CMP_DKDV_DS_SWEEP[0]:
        _cmp_dkdv_whole_step(T, config, (CMP_DKDV_DS_SWEEP[0], best))


#: The compressed dQ from ``dS`` by ``(block_n, num_warps, num_stages, query_tiles)``
#: (``DQ_DS_HOPPER_TILES``), the default first. Compiled for sm_90 (Triton 3.6, 64-token steps in 3
#: stages; registers / shared memory): one query tile a program 92 / 72 KiB with 4 warps (3 programs
#: an SM), 58 with 8; two tiles 167 / 96 KiB with 4 warps, 94 with 8 (2 an SM); four 170 / 144 KiB
#: with 8 warps (1 an SM; with 4 it spills). Each ``K`` tile serves every query tile of its program,
#: so two tiles a program load a third fewer bytes a tile from L2 (the 16 KiB ``K`` tile once for two
#: 8 KiB ``dS`` tiles). Session 57 (H200, the kernel in the profiler, ms at 64k / 8k): (64, 4, 3, 1),
#: the default until then, 5.226 / 0.141; (64, 8, 3, 2) 4.628 / 0.130; (64, 8, 2, 2) 5.330 / 0.141;
#: (64, 4, 3, 2) 4.645 / 0.128; (64, 8, 3, 4) 4.999 / 0.141; (64, 8, 3, 1) 5.445 / 0.146; (32, 8, 3, 2)
#: 5.097 / 0.135.
DQ_DS_SWEEP = ((64, 8, 3, 2), (64, 4, 3, 1), (64, 4, 3, 2), (64, 8, 3, 4))


def dq_ds_tiles(T: int, config: NSAConfig) -> None:
    """The compressed dQ from ``dS`` by its launch (:data:`DQ_DS_SWEEP`): the compressed backward as
    training calls it (dq against the first variant's), each variant's kernels (the mean of 5 calls),
    then the fastest dQ against the default in the whole forward+backward (ABBA, :func:`step_abba`)
    and its kernels."""
    import os
    from unittest import mock

    from nsa.ops.compressed import kernel as cmp

    keys = ("block_n", "num_warps", "num_stages", "query_tiles")
    q, k_cmp, v_cmp, o, lse, do, delta, gate, scale = _compressed_training_case(T, config)
    first, times = None, {}
    with mock.patch.dict(os.environ, {"NSA_COMPRESSED_DQ_FROM_DS_MIB": str(1 << 20)}):
        for tiles in DQ_DS_SWEEP:
            call = lambda: cmp.compressed_bwd(q, k_cmp, v_cmp, o, lse, do, None, config, scale, 0, delta=delta,
                                              gate=gate, dq_ds=tiles)  # fmt: skip
            first, _ = timed_variant(T, f"compressed backward, dQ from dS {tiles}", call, first, slice(0, 1))
        for tiles in DQ_DS_SWEEP:
            with tiles_as_default(cmp.DQ_DS_HOPPER_TILES, **dict(zip(keys, tiles))):
                call = lambda: cmp.compressed_bwd(q, k_cmp, v_cmp, o, lse, do, None, config, scale, 0, delta=delta,
                                                  gate=gate)  # fmt: skip
                try:
                    times[tiles] = _list_kernels(T, f"compressed backward, dQ from dS {tiles}", call, steps=5,
                                                 kernel="compressed_bwd_dq_ds_kernel")
                except Exception as err:  # noqa: BLE001
                    print(f"T={T} dQ from dS {tiles}: {type(err).__name__}: {err}", flush=True)
    del q, k_cmp, v_cmp, o, lse, do, delta, gate, first
    times = {tiles: ms for tiles, ms in times.items() if ms is not None}
    if DQ_DS_SWEEP[0] not in times:
        return
    best = min(times, key=times.get)
    print(f"T={T} fastest dQ from dS in the lists: {best} ({times[best]:.3f} ms, the default "
          f"{times[DQ_DS_SWEEP[0]]:.3f})", flush=True)
    if best != DQ_DS_SWEEP[0]:
        variants = tuple((str(tiles), dict(zip(keys, tiles))) for tiles in (DQ_DS_SWEEP[0], best))
        step_abba(T, config, cmp.DQ_DS_HOPPER_TILES, variants, "dQ from dS")
        kernels_by_default(T, config, cmp.DQ_DS_HOPPER_TILES, variants, "dQ from dS")


def _selected_after_window(q, k, v, gates, idx, o_cmp, win, config: NSAConfig, t0: int = 0,
                           t1: Optional[int] = None) -> torch.Tensor:
    """The selected forward with the branches' gated sum, as the inference path runs it, over
    queries ``t0 .. t1``: it starts from ``win``, the window launch's ``(o, lse, o_frc, lse_frc)``
    of those queries (``window_fwd_forced``)."""
    from nsa.ops.selected.kernel import selected_fwd_summed

    rows = slice(t0, t1)
    o_win, _, o_frc, lse_frc = win
    return selected_fwd_summed(q[:, rows], k, v, idx[:, rows].contiguous(), config.sel_block, config.softmax_scale(D),
                               t0, gates[:, rows], o_cmp[:, rows], o_win,
                               forced=(config.init_blocks, config.local_blocks), start=(o_frc, lse_frc),
                               keep=False)[0]


def _selected_inputs(T: int, config: NSAConfig, seed: int) -> Tuple[torch.Tensor, ...]:
    """What the selected forward takes as the inference path runs it, the compressed branch run once:
    ``(q, k, v, gates, scale, o_cmp, idx)`` (``idx`` contiguous)."""
    from nsa.ops.compressed.kernel import compressed_attention_select

    q, k, v, gates = inputs(T, seed)
    scale = config.softmax_scale(D)
    o_cmp, _, idx = compressed_attention_select(q, mean_compress(k, config), mean_compress(v, config), config,
                                                scale, 0)
    return q, k, v, gates, scale, o_cmp, idx.contiguous()


def _hand_over(tensors, stream: torch.cuda.Stream) -> None:
    """Tensors made on a side stream, now used on ``stream`` (which already waits for them)."""
    for t in tensors:
        t.record_stream(stream)


def window_beside_compressed(T: int, config: NSAConfig) -> None:
    """The inference forward (``nsa_attention`` without a gradient) with its window kernel, which
    also computes the selected branch's forced blocks and needs nothing from the compressed
    branch, on a second stream beside mean pooling, the compressed pass and its top-n (at 8k both
    kernels run at 41-50 % of SM and L2 peak, session 23); the selected kernel waits for both.
    The window launched before or after the compressed pass; each result against the library's
    (bitwise), two rounds in turn."""
    from nsa.ops.compressed.kernel import compressed_attention_select
    from nsa.ops.window.kernel import window_fwd_forced

    q, k, v, gates = inputs(T, T + 5)
    scale = config.softmax_scale(D)
    side = torch.cuda.Stream()

    def step(window_at: str) -> torch.Tensor:
        main = torch.cuda.current_stream()

        def window():
            if window_at == "serial":
                return window_fwd_forced(q, k, v, config, scale, 0)
            side.wait_stream(main)
            with torch.cuda.stream(side):
                return window_fwd_forced(q, k, v, config, scale, 0)

        win = window() if window_at == "first" else None
        k_cmp, v_cmp = mean_compress(k, config), mean_compress(v, config)
        o_cmp, _, idx = compressed_attention_select(q, k_cmp, v_cmp, config, scale, 0)
        win = win or window()
        if window_at != "serial":
            main.wait_stream(side)
            _hand_over(win, main)
        return _selected_after_window(q, k, v, gates, idx, o_cmp, win, config)

    library = lambda: nsa_attention(q, k, v, gates, config, backend="triton")  # noqa: E731
    want = library()
    cases = (("nsa_attention", library), ("the same launches composed here", lambda: step("serial")),
             ("window first, on a second stream", lambda: step("first")),
             ("window after the compressed pass, on a second stream", lambda: step("after")))
    for _round in range(2):
        for label, fn in cases:
            same = torch.equal(fn(), want)
            print(f"T={T} forward, {label}: {bench(fn):.3f} ms (bitwise equal to nsa_attention: {same})", flush=True)


def window_selected_pipelined(T: int, config: NSAConfig) -> None:
    """The window kernel (with the forced blocks) and the selected kernel that starts from its
    forced-block result, by query chunks: chunk ``c``'s selected launch waits only for chunk ``c``'s
    window launch. On one stream, and with the window's chunks on a second stream, so that the
    selected kernel (bound by L2) can run beside the next chunk's window (latency-bound: 41-50 %
    of SM and L2 peak at 8k, session 23). Outputs against the whole launches (bitwise), two
    rounds in turn; the compressed pass runs once, before."""
    from nsa.ops.window.kernel import window_fwd_forced

    q, k, v, gates, scale, o_cmp, idx = _selected_inputs(T, config, T + 7)
    side = torch.cuda.Stream()

    def chunked(chunks: int, streams: int) -> List[torch.Tensor]:
        bounds = [(T * c // chunks, T * (c + 1) // chunks) for c in range(chunks)]
        main, outs, wins = torch.cuda.current_stream(), [], []
        if streams == 2:
            side.wait_stream(main)
        for t0, t1 in bounds:
            with torch.cuda.stream(side if streams == 2 else main):
                wins.append(window_fwd_forced(q[:, t0:t1], k, v, config, scale, t0))
                done = torch.cuda.Event()
                done.record()
            if streams == 2:
                main.wait_event(done)
                _hand_over(wins[-1], main)
            outs.append(_selected_after_window(q, k, v, gates, idx, o_cmp, wins[-1], config, t0, t1))
        return outs

    want = torch.cat(chunked(1, 1), 1)
    cases = [("whole launches, one stream", lambda: chunked(1, 1))]
    for chunks in (2, 4, 8, 16):
        if T // chunks >= 512:
            cases += [(f"{chunks} chunks, one stream", lambda c=chunks: chunked(c, 1)),
                      (f"{chunks} chunks, window on a second stream", lambda c=chunks: chunked(c, 2))]
    for _round in range(2):
        for label, fn in cases:
            same = torch.equal(torch.cat(fn(), 1), want)
            print(f"T={T} window + selected forward, {label}: {bench(fn):.3f} ms (bitwise equal: {same})", flush=True)


def scores_planes(T: int, config: NSAConfig) -> None:
    """What the block masses' second plane costs (session 75, run before the planes were stored at the
    block their masses land in; the sum below is now in that convention): each query chunk's Gluon
    scoring pass with its two planes and with the first alone (timing only: the first plane's masses
    without the straddling tokens' halves), and the top-n on the two planes and on their sum as one
    plane (the same blocks), ``do_bench`` medians, two rounds; then the top-n over chunks twice as
    long (one plane fits twice the queries in the buffer). The paper's geometry (``config`` unused)."""
    from nsa.ops._triton.block_topn import block_topn
    from nsa.ops._triton.compressed_fwd import SCORE_BUFFER_BYTES, query_chunk
    from ncu_range import scoring_setup

    c = scoring_setup(T)
    cfg, B, TQ, H, nsel, planes = c.config, c.B, c.TQ, c.H, c.nsel, c.planes
    topn = lambda masses, out, t0: block_topn(masses, out, t0, t0, cfg.sel_block, cfg.init_blocks,  # noqa: E731
                                              cfg.local_blocks)
    buf = torch.empty(B * c.chunk * H * planes * nsel, device=DEV)
    idx = torch.empty(B, TQ, H, cfg.sel_count, dtype=torch.int32, device=DEV)
    idx_one = torch.empty_like(idx)
    totals: dict = {}
    for rnd in (1, 2):
        for t0 in range(0, TQ, c.chunk):
            t1 = min(t0 + c.chunk, TQ)
            sc = buf[: B * (t1 - t0) * H * planes * nsel].view(B, t1 - t0, H, planes, nsel)
            for n_planes in (planes, 1):
                ms = bench(lambda: c.masses(t0, t1, sc, n_planes))
                totals.setdefault(f"scoring pass, {n_planes} plane(s)", []).append((rnd, ms))
            c.masses(t0, t1, sc)
            summed = torch.zeros(B, t1 - t0, H, 1, nsel, device=DEV)
            for s in range(planes):  # plane s at block j: what block j - s put into j (from session 75)
                summed[..., s:] += sc[:, :, :, s, s:].unsqueeze(3)
            for label, masses, out in (("top-n, 2 planes", sc, idx), ("top-n, 1 plane", summed, idx_one)):
                topn(masses, out, t0)
                totals.setdefault(label, []).append((rnd, bench(lambda: topn(masses, out, t0))))
        print(f"T={T} blocks of the two top-n forms equal: {torch.equal(idx, idx_one)}", flush=True)
    # one plane: chunks twice as long in the same buffer
    long_chunk = query_chunk(B, TQ, H, nsel, 128 // (c.q.shape[2] // H), SCORE_BUFFER_BYTES)
    masses = torch.rand(B, long_chunk, H, 1, nsel, device=DEV)
    for rnd in (1, 2):
        for t0 in range(0, TQ, long_chunk):
            ms = bench(lambda: topn(masses[:, : min(long_chunk, TQ - t0)], idx_one, t0))
            totals.setdefault(f"top-n, 1 plane, chunks of {long_chunk}", []).append((rnd, ms))
    for label, runs in totals.items():
        per_round = [sum(ms for r, ms in runs if r == rnd) for rnd in (1, 2)]
        print(f"T={T} {label}: {per_round[0]:.3f}, {per_round[1]:.3f} ms over the chunks "
              f"({len(runs) // 2} launches)", flush=True)


def topn_aligned(T: int, config: NSAConfig) -> None:
    """The top-n reading its planes aligned and in whole 16-block pieces (session 75) against the
    saved copy of the kernel before (``scripts/_old_block_topn.py``, e.g. ``git show
    0cb142f:src/nsa/ops/_triton/block_topn.py``: plane ``s`` read ``s`` blocks earlier, block by
    block), each query chunk of length ``T`` on the real masses (the library's scoring pass; the old
    kernel on the same masses moved to its convention): the same blocks, and ``do_bench`` medians
    over the chunks, two rounds in turn; then the forward's kernel lists."""
    from nsa.ops._triton.block_topn import block_topn
    from ncu_range import scoring_setup

    old = _previous("block_topn")
    if old is None:
        print("topn_aligned: no scripts/_old_block_topn.py", flush=True)
        return
    c = scoring_setup(T)
    cfg, B, TQ, H, nsel, planes = c.config, c.B, c.TQ, c.H, c.nsel, c.planes
    idx_new = torch.empty(B, TQ, H, cfg.sel_count, dtype=torch.int32, device=DEV)
    idx_old = torch.empty_like(idx_new)
    times: dict = {}
    for t0 in range(0, TQ, c.chunk):
        t1 = min(t0 + c.chunk, TQ)
        sc = torch.full((B, t1 - t0, H, planes, nsel), float("nan"), device=DEV)
        c.masses(t0, t1, sc)
        sc_old = sc.clone()
        for s in range(1, planes):  # the old convention: plane s indexed by the tokens' own block
            sc_old[:, :, :, s, : nsel - s] = sc[:, :, :, s, s:]
        calls = {"aligned (now)": lambda: block_topn(sc, idx_new, t0, t0, cfg.sel_block, cfg.init_blocks,
                                                     cfg.local_blocks),
                 "before": lambda: old.block_topn(sc_old, idx_old, t0, t0, cfg.sel_block, cfg.init_blocks,
                                                  cfg.local_blocks)}
        for rnd in (1, 2):
            for label, call in calls.items():
                call()
                times.setdefault(label, {}).setdefault(rnd, []).append(bench(call))
    print(f"T={T} top-n blocks equal, aligned against before: {torch.equal(idx_new, idx_old)}", flush=True)
    for label, by_round in times.items():
        print(f"T={T} top-n {label}: " + ", ".join(f"{sum(v):.3f}" for v in by_round.values())
              + f" ms over {len(by_round[1])} launches (chunks: " + ", ".join(f"{ms:.3f}" for ms in by_round[1]) + ")",
              flush=True)
    forward_kernel_times(T, config, steps=5)


#: The compressed forward's cap on its block-score buffer, under which the queries run in chunks (each
#: chunk a scoring pass and a top-n launch): 256 MiB (the default: 8 chunks at 64k), 512 MiB and 1 GiB.
SCORE_BUDGETS = (("256 MiB", {}), ("512 MiB", {"score_buffer_bytes": 512 << 20}),
                 ("1 GiB", {"score_buffer_bytes": 1 << 30}))


def score_budget(T: int, config: NSAConfig) -> None:
    """:data:`SCORE_BUDGETS` as ``compressed_fwd``'s keyword default: the forward in ABBA rounds
    (:func:`step_abba`) and its kernel lists (:func:`kernels_by_default`)."""
    from nsa.ops._triton import compressed_fwd as module

    table = module.compressed_fwd.__kwdefaults__
    step_abba(T, config, table, SCORE_BUDGETS, "score buffer", forward=True)
    kernels_by_default(T, config, table, SCORE_BUDGETS, "score buffer", forward=True)


#: The sections after the launch gaps, in the order they run (``--skip`` names them).
SECTIONS = {
    "selected": selected_variants, "inversion": inversion_profile, "cmp": cmp_select_ab, "dkdv": selected_dkdv_ab,
    "window": window_variants, "forced": forced_variants, "forced_ab": forced_ab, "gated": gated_window_ab,
    "cmp_dkdv": cmp_dkdv_variants, "sel_dkdv": sel_dkdv_variants, "kernels": kernel_times,
    "fwd_kernels": forward_kernel_times,
    "gated_bits": gated_bits, "training": training_ab, "gate_ab": gate_ab, "cmp_bwd": cmp_bwd_ab,
    "cmp_fwd": cmp_fwd_variants, "cmp_parts": cmp_fwd_parts, "topn": topn_variants, "sel_tiles": sel_tiles, "kv_desc": kv_descriptors,
    "dq_ds": dq_from_ds, "sel_dkdv_ds": sel_dkdv_ds_variants, "cmp_dq_ds": cmp_dq_from_ds, "cmp_dkdv_ds": cmp_dkdv_with_ds,
    "win_beside": window_beside_compressed, "win_slc_pipe": window_selected_pipelined,
    "win_dkdv": window_dkdv_tiles, "win_dkdv_kernels": window_dkdv_kernels, "win_dkdv_step": window_dkdv_step,
    "topn_bounds": topn_bounds, "pass2_apart": pass2_apart, "pass2_tiles": pass2_tiles, "pass2_wide": pass2_wide,
    "pass1_tiles": pass1_tiles, "forced_place": forced_place, "dq_ds_tiles": dq_ds_tiles,
    "pass1_wide": pass1_wide, "pass1_desc": pass1_desc, "pass1_serial": pass1_serial,
    "pass1_rate": pass1_rate, "gluon_dkdv": gluon_dkdv, "gluon_dkdv_variants": gluon_dkdv_variants,
    "gluon_selected_dkdv": gluon_selected_dkdv,
    "gluon_selected_qseg": gluon_selected_qseg, "gluon_window_dkdv": gluon_window_dkdv,
    "gluon_pass1": gluon_pass1, "gluon_window_dq": gluon_window_dq, "gluon_window_fwd": gluon_window_fwd,
    "gluon_scores": gluon_scores, "short_apart": short_apart, "sel_regs": sel_regs,
    "win_slc_partition": win_slc_partition, "scores_planes": scores_planes,
    "topn_aligned": topn_aligned, "score_budget": score_budget,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 65536])
    parser.add_argument("--profile-host", default="", help="write a cProfile of 20 forward+backward calls at 8k here")
    parser.add_argument("--skip", nargs="*", default=[], choices=list(SECTIONS) + ["gaps"])
    parser.add_argument("--only", nargs="*", default=None, choices=list(SECTIONS) + ["gaps"],
                        help="run these sections alone")
    parser.add_argument("--kernels", type=int, default=16, help="kernels listed by the section 'kernels'")
    parser.add_argument("--dkdv-variant", action="append", default=[], metavar="LABEL=FILE",
                        help="a gluon_dkdv.py for the section 'gluon_dkdv_variants' (repeat for more)")
    parser.add_argument("--dkdv-branch", choices=("compressed", "selected", "window"), default="compressed",
                        help="the branch whose Gluon module the variants replace")
    parser.add_argument("--variant-module", choices=("gluon_dkdv", "gluon_dq", "gluon_fwd", "gluon_pass1"),
                        default="gluon_dkdv", help="the module the variants replace (gluon_dq, gluon_fwd: the "
                        "window's dQ, forward; gluon_pass1: the compressed forward's pass 1)")
    args = parser.parse_args()
    for spec in args.dkdv_variant:
        label, sep, path = spec.partition("=")
        if not sep or not label or not path:
            parser.error(f"--dkdv-variant wants LABEL=FILE, got {spec!r}")
        DKDV_VARIANTS.append((label, path))
    global KERNELS_LISTED, DKDV_BRANCH, VARIANT_MODULE
    if args.variant_module in ("gluon_dq", "gluon_fwd") and args.dkdv_branch != "window":
        parser.error(f"--variant-module {args.variant_module} is the window's: add --dkdv-branch window")
    if args.variant_module == "gluon_pass1" and args.dkdv_branch != "compressed":
        parser.error("--variant-module gluon_pass1 is the compressed branch's: leave --dkdv-branch compressed")
    DKDV_BRANCH, VARIANT_MODULE = args.dkdv_branch, args.variant_module
    KERNELS_LISTED = args.kernels
    config = NSAConfig()
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}, triton {triton.__version__}, CUDA {torch.version.cuda}")
    cpms = cycles_per_ms()
    print(f"device sleep: {cpms:.0f} cycles per ms", flush=True)
    for T in args.lengths:
        wanted = lambda name: name not in args.skip and (args.only is None or name in args.only)
        if wanted("gaps"):
            launch_gaps(T, config, cpms, args.profile_host)
        for name, section in SECTIONS.items():
            if wanted(name):
                section(T, config)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
