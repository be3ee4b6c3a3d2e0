"""NSA decode on the GPU: correctness at real sizes and CUDA-graph timings against dense SDPA.

For each context S and batch B (bf16, HQ=64, H=4, D=128, paper defaults, one layer):

* correctness (B = 1, and B = 16 of different lengths): the Triton decode of the query
  at position S - 1 against the reference prefill ops at ``q_offset = S - 1`` in float32
  (relative error, fraction of identical selected blocks), and with programmatic
  dependent launch on against off (must be bitwise equal);
* timing: ``nsa_decode`` (selection included) captured in a CUDA graph, with and without
  programmatic dependent launch, against dense
  ``scaled_dot_product_attention(q, K, V, enable_gqa=True)`` over the whole cache,
  also captured (the fastest SDPA backend that runs), both as ``triton.testing.do_bench``
  medians of graph replays with the L2 cache flushed before each;
* tokens read per step from the real selected blocks vs the spec's expected count.

Usage: ``python scripts/gpu_decode.py [--contexts 8192 65536] [--check-contexts 8192] [--batches 1 16]
[--variants [8192 65536]] [--launch JSON ...] [--check-variants] [--l2-persist-mb MB] [--out decode.md]``.
Prints a markdown report (device, versions, date, tables, the registers and spills of every
compiled decode kernel) and writes it to ``--out``. ``--l2-persist-mb`` first sets aside that
much L2 for evict-last lines (-1: the device's most); it changes the whole process, dense included.
"""

from __future__ import annotations

import argparse
import datetime
import json
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
import triton
from triton.runtime.errors import OutOfResources
from triton.testing import do_bench

from nsa import NSAConfig
from nsa.modules.cache import count_reads
from nsa.ops import mean_compress
from nsa.ops.decode import nsa_decode
from nsa.ops.decode.kernel import decode_fwd
from nsa.testing import rel_error

HQ, H, D = 64, 4, 128
CONFIG = NSAConfig()
DEVICE = "cuda"
# launch overrides timed with --variants (each default turned back, and candidates): {batch 1?: [...]},
# and those of one context alone: {(batch 1?, context): [...]}; (6, 2, 4) are the default
# compressed, window and selected splits at B = 16, 64k on 132 SMs since session 42 ((8, 2, 8)
# before), (16, 4, 1) at B = 1, 64k.
# A launch may carry "head_major": True, which times the same caches stored head-major.
# Session 23's list (which of the score, selected and combine launches start early at batch 1:
# programmatic dependent launch per launch) is in docs/perf/raw/session23_decode_pdl_per_launch_h100.md;
# session 21's lists (the top-n rounds, score tiles, selected blocks a program, warps, compressed splits) are
# in docs/perf/raw/session21_decode_variants_h100.md and session21_decode_sweep_h100.md.
# Session 25's list (score tiles of 32-256 blocks ranked by a bitonic top-k) is in
# docs/perf/attempts/decode_score_tile_topk.patch, its output in docs/perf/raw/session25_decode_score_topk_h100.md.
# Session 25 also timed the score programs taking each block's token before it from their own
# tile's range (tl.gather): docs/perf/attempts/decode_score_gather_tile_tokens.patch, output in
# docs/perf/raw/session25_decode_score_gather_h100.md. Each list is timed on a tree with its patch.
VARIANTS: Dict[bool, List[dict]] = {True: [{}], False: [{}]}
CONTEXT_VARIANTS: Dict[Tuple[bool, int], List[dict]] = {}


def parse_launch(text: str) -> dict:
    """``decode_fwd`` overrides from JSON (lists become tuples, as ``splits`` takes them)."""
    launch = json.loads(text)
    if not isinstance(launch, dict):
        raise argparse.ArgumentTypeError(f"--launch takes a JSON object, got {text!r}")
    return {name: tuple(value) if isinstance(value, list) else value for name, value in launch.items()}


def make_inputs(B: int, S: int, lengths: Optional[List[int]] = None) -> Dict[str, torch.Tensor]:
    """Random bf16 caches of capacity S (separate raw k/v per branch) and one new query per sequence."""
    dev, bf = DEVICE, torch.bfloat16
    lens = lengths or [S] * B
    t = {name: torch.randn(B, S, H, D, device=dev, dtype=bf) for name in ("k", "v", "k_win", "v_win", "k_raw", "v_raw")}
    t["k_cmp"], t["v_cmp"] = mean_compress(t.pop("k_raw"), CONFIG), mean_compress(t.pop("v_raw"), CONFIG)
    t["q"] = torch.randn(B, 1, HQ, D, device=dev, dtype=bf)
    t["gates"] = torch.rand(B, 1, HQ, 3, device=dev, dtype=bf)
    t["seq_lens"] = torch.tensor(lens, device=dev, dtype=torch.int32)
    return t


def head_major(x: torch.Tensor) -> torch.Tensor:
    """A ``[B, T, H, D]`` cache tensor stored head-major (each head's tokens contiguous), same view."""
    return x.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3) if x.dim() == 4 and x.shape[1] > 1 else x


def inputs_for(t: Dict[str, torch.Tensor], launch: dict):
    """``(inputs, decode_fwd overrides)`` of one variant: its ``"head_major"`` key, if any, turns
    into head-major copies of the caches (made only for the variants that ask)."""
    launch = dict(launch)
    if launch.pop("head_major", False):
        t = {name: head_major(x) for name, x in t.items()}
    return t, launch


def run_nsa(t: Dict[str, torch.Tensor], backend: str = "triton", **launch):
    args = (t["q"], t["k"], t["v"], t["gates"], t["seq_lens"], t["k_cmp"], t["v_cmp"], t["k_win"], t["v_win"])
    if launch:
        return decode_fwd(*args, CONFIG, CONFIG.softmax_scale(D), **launch)
    return nsa_decode(*args[:5], CONFIG, kv_cmp=args[5:7], kv_win=args[7:], backend=backend, return_block_idx=True)


def run_reference(t: Dict[str, torch.Tensor]):
    """``(o, block_idx)`` of the float32 reference on the same inputs, upcast."""
    return run_nsa({k: (v.float() if v.is_floating_point() else v) for k, v in t.items()}, "reference")


def check(t: Dict[str, torch.Tensor], variants: List[dict] = ()) -> Dict[str, float]:
    """Default launch against the float32 reference and PDL on against off; each of
    ``variants`` against the same reference (``variants``: {name: (rel_err, blocks_equal)})."""
    o, idx = run_nsa(t)
    o_plain, idx_plain = run_nsa(t, pdl=False)
    ref_o, ref_idx = run_reference(t)
    res = {"rel_err": rel_error(o, ref_o), "blocks_equal": float((idx == ref_idx).float().mean()), "idx": idx,
           "pdl_same": bool(torch.equal(o, o_plain) and torch.equal(idx, idx_plain)), "variants": {}}
    for shown in variants:
        tt, launch = inputs_for(t, shown)
        try:
            o_v, idx_v = run_nsa(tt, **launch)
            res["variants"][str(shown)] = f"{rel_error(o_v, ref_o):.2e}, {100 * float((idx_v == ref_idx).float().mean()):.2f}%"
        except Exception as err:  # noqa: BLE001 - a variant that fails is reported, not fatal
            res["variants"][str(shown)] = f"failed ({type(err).__name__}: {str(err)[:100]})"
    return res


def pdl_or_fallback() -> str:
    """Run one small default (PDL) step; if this Triton/driver cannot, turn PDL off for the run."""
    import nsa.ops.decode.kernel as decode_kernel

    try:
        run_nsa(make_inputs(1, 4096))
        torch.cuda.synchronize()
        return "on"
    except Exception as err:  # noqa: BLE001 - any launch failure means: measure without PDL
        decode_kernel.pdl_supported = lambda device: False
        return f"off (failed: {type(err).__name__}: {str(err).splitlines()[0][:120]})"


def unequal_lengths(S: int, B: int) -> List[int]:
    """``B`` lengths from S down to about S/3, none on a stride or block multiple but the first."""
    return [S] + [S - (i * (2 * S // 3)) // B - 3 * i for i in range(1, B)]


def graph_of(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """``fn`` captured in a CUDA graph (after three warm-up calls on a side stream); the
    captured call's result stays on the graph as ``graph.output``, rewritten by each replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph.output = fn()
    return graph


def time_us(fn: Callable[[], object]) -> float:
    graph = graph_of(fn)
    return 1e3 * do_bench(graph.replay, warmup=50, rep=300, return_mode="median")


def dense_inputs(B: int, S: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Dense decode's ``q [B, HQ, 1, D]`` and whole-cache ``K``, ``V [B, H, S, D]`` (SDPA's layout, bf16)."""
    q = torch.randn(B, HQ, 1, D, device=DEVICE, dtype=torch.bfloat16)
    K, V = (torch.randn(B, H, S, D, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
    return q, K, V


def dense_us(B: int, S: int) -> Dict[str, float]:
    """Dense decode over the whole cache in SDPA's layout, per SDPA backend that runs."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, K, V = dense_inputs(B, S)
    out = {}
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                          ("cudnn", SDPBackend.CUDNN_ATTENTION), ("math", SDPBackend.MATH)):  # fmt: skip
        if name == "math" and B * S > 16 * 65536 // 4:
            continue
        try:
            with sdpa_kernel(backend):
                out[name] = time_us(lambda: F.scaled_dot_product_attention(q, K, V, enable_gqa=True))
        except RuntimeError as err:  # a backend that does not support this case reports and is skipped
            print(f"  dense {name} B={B} S={S}: unavailable ({str(err).splitlines()[0][:80]})")
    return out


def kernel_breakdown(t: Dict[str, torch.Tensor], **launch) -> str:
    """CUDA time of each decode kernel (eager launches, profiler averages), without PDL: with
    it a kernel's time would include its wait for the one before."""
    from torch.profiler import ProfilerActivity, profile

    launch = dict(launch, pdl=False)
    for _ in range(3):
        run_nsa(t, **launch)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            run_nsa(t, **launch)
        torch.cuda.synchronize()
    rows = [e for e in prof.key_averages() if "decode" in e.key]
    names = [e.key.replace("decode_", "").replace("_kernel", "") for e in rows]
    return ", ".join(f"{n} {getattr(e, 'device_time', None) or e.cuda_time:.1f}us" for n, e in zip(names, rows))


def persist_l2(mb: float) -> str:
    """Set aside ``mb`` MB of L2 for persisting (evict-last) lines, -1 for the device's most,
    through the driver API (``cuCtxSetLimit``); returns what the device reports afterwards."""
    import ctypes

    cuda = ctypes.CDLL("libcuda.so.1")
    limit_persisting_l2, attr_max_persisting_l2 = 0x06, 108  # CU_LIMIT_..., CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE
    most = ctypes.c_int()
    assert cuda.cuDeviceGetAttribute(ctypes.byref(most), attr_max_persisting_l2, torch.cuda.current_device()) == 0
    want = most.value if mb < 0 else int(mb * 2**20)
    torch.cuda.synchronize()
    assert cuda.cuCtxSetLimit(limit_persisting_l2, ctypes.c_size_t(want)) == 0
    got = ctypes.c_size_t()
    assert cuda.cuCtxGetLimit(ctypes.byref(got), limit_persisting_l2) == 0
    return f"persisting L2 set-aside {got.value / 2**20:.1f} MB (device most {most.value / 2**20:.1f} MB)"


def compiled_resources() -> List[str]:
    """Registers, spills and shared memory of every decode kernel compiled so far (one line each)."""
    import nsa.ops.decode.kernel as decode_kernel

    out = []
    for name in ("decode_cmp_win_fwd_kernel", "decode_score_kernel", "decode_selected_fwd_kernel", "decode_combine_kernel"):
        for entry in getattr(decode_kernel, name).device_caches.values():
            for compiled in entry[0].values():
                meta = compiled.metadata
                out.append(f"- {name} (warps {meta.num_warps}, stages {meta.num_stages}): {compiled.n_regs} registers, "
                           f"{compiled.n_spills} spills, {meta.shared} B shared")  # fmt: skip
    return out


def time_row(t: Dict[str, torch.Tensor], S: int, B: int, reads: Dict[int, tuple]) -> str:
    nsa = time_us(lambda: run_nsa(t))
    plain = time_us(lambda: run_nsa(t, pdl=False))
    dense = dense_us(B, S)
    best = min(dense, key=dense.get)
    if S not in reads:  # tokens read by the step at position S - 1, from its real blocks
        r = count_reads(run_nsa(t)[1][:1], S - 1, CONFIG).last_step()
        reads[S] = (r["total"], CONFIG.decode_reads(S))
    got, want = reads[S]
    return (f"| {S} | {B} | {nsa:.1f} | {plain:.1f} | {dense[best]:.1f} ({best}) | {dense[best] / nsa:.2f}x | "
            f"{got:.0f} / {want} | {kernel_breakdown(t)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[8192, 16384, 32768, 65536])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--check-contexts", type=int, nargs="+", default=None, help="contexts checked (default: all)")
    parser.add_argument("--variants", type=int, nargs="*", default=None,
                        help="also time launch variants at these contexts (none given: the longest)")
    parser.add_argument("--launch", action="append", default=[], type=parse_launch, metavar="JSON",
                        help="a launch variant to time with --variants (at every context and batch), as decode_fwd "
                             "overrides in JSON, e.g. '{\"cmp_tile\": 64, \"splits\": [6, 2, 8]}'; repeatable")
    parser.add_argument("--check-variants", action="store_true", help="check every launch variant against the reference too")
    parser.add_argument("--l2-persist-mb", type=float, default=None,
                        help="set aside this much L2 for evict-last lines first (-1: the device's most)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    for one in (True, False):
        VARIANTS[one] += args.launch
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    persisting = persist_l2(args.l2_persist_mb) if args.l2_persist_mb is not None else "persisting L2 set-aside: as found"
    lines = [
        "# NSA decode vs dense SDPA (CUDA-graph replay, one layer)",
        "",
        f"Device: {props.name} ({props.multi_processor_count} SMs); torch {torch.__version__}, triton {triton.__version__}, "
        f"CUDA {torch.version.cuda}; {datetime.date.today().isoformat()}.",
        f"bf16, HQ={HQ}, H={H}, D={D}, paper defaults ({CONFIG.cmp_block}/{CONFIG.cmp_stride}/{CONFIG.sel_block}/"
        f"{CONFIG.sel_count}/{CONFIG.window}); `do_bench` medians of graph replays, L2 flushed; dense = fastest SDPA backend.",
        "",
        "## Correctness (bf16 Triton decode vs float32 reference prefill at q_offset = S - 1)",
        "",
        "| context | batch (lengths) | rel. error | selected blocks equal | PDL on == off (bitwise) |",
        "|---|---|---|---|---|",
    ]
    lines.insert(4, f"Programmatic dependent launch: {pdl_or_fallback()}; {persisting}.")

    def report_so_far() -> None:
        """The report as far as it goes, in ``--out``, so that a run stopped by a time limit keeps
        what it measured."""
        if args.out:
            with open(args.out, "w") as f:
                f.write("\n".join(lines) + "\n")

    reads = {}
    for S in args.check_contexts or args.contexts:
        for lens in ([S], unequal_lengths(S, 16)):
            one = len(lens) == 1
            res = check(make_inputs(len(lens), S, lens),
                        VARIANTS[one] + CONTEXT_VARIANTS.get((one, S), []) if args.check_variants else ())  # fmt: skip
            shown = ", ".join(map(str, lens)) if len(lens) < 4 else f"{lens[0]}, {lens[1]}, ..., {lens[-1]}"
            lines.append(f"| {S} | {len(lens)} ({shown}) | {res['rel_err']:.2e} | {100 * res['blocks_equal']:.2f}% | {res['pdl_same']} |")
            lines += [f"|   | variant {name} | {got} | | |" for name, got in res["variants"].items()]
            print("\n".join(lines[-1 - len(res["variants"]):]), flush=True)
            report_so_far()
    lines += ["", "## Time per decode step", "",
              "| context | B | NSA us | NSA us, no PDL | dense us (backend) | dense / NSA | tokens read (real blocks / spec) | kernels (eager, CUDA time) |",
              "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for S in args.contexts:
        for B in args.batches:
            t = make_inputs(B, S)
            try:
                lines.append(time_row(t, S, B, reads))
            except RuntimeError as err:  # a failing point is reported; the others still run
                lines.append(f"| {S} | {B} | failed: {type(err).__name__}: {str(err).splitlines()[0][:100]} |")
            print(lines[-1], flush=True)
            report_so_far()
            del t
            torch.cuda.empty_cache()
    for S in args.variants or ([max(args.contexts)] if args.variants is not None else []):
        lines += ["", f"Launch variants at context {S} (NSA us):", ""]
        for B in args.batches:
            t = make_inputs(B, S)
            for shown in VARIANTS[B == 1] + CONTEXT_VARIANTS.get((B == 1, S), []):
                tt, launch = inputs_for(t, shown)
                try:
                    us = time_us(lambda: run_nsa(tt, **launch))
                    lines.append(f"- B={B} {shown}: {us:.1f} ({kernel_breakdown(tt, **launch)})")
                except (OutOfResources, RuntimeError) as err:  # a variant that fails is reported, not fatal
                    lines.append(f"- B={B} {shown}: failed ({type(err).__name__}: {str(err)[:80]})")
                print(lines[-1], flush=True)
                report_so_far()
                del tt
            del t
            torch.cuda.empty_cache()
    try:
        lines += ["", "Compiled decode kernels:", ""] + compiled_resources()
    except Exception as err:  # noqa: BLE001 - the resource report is informative only
        lines.append(f"(resources unavailable: {type(err).__name__}: {err})")
    print("\n" + "\n".join(lines) + "\n")
    report_so_far()


if __name__ == "__main__":
    main()
