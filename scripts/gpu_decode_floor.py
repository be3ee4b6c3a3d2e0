"""How fast could a batch-1 decode step be? Synthetic steps: its bytes and dependencies, no attention math.

The decode issue asks for <= 15 us per step at batch 1, 64k context (bf16, HQ 64, H 4, D 128,
paper defaults, CUDA-graph replay). Whatever the kernels, a step must:

1. read the compressed keys (4095 tokens x 4 heads x 128, 4.2 MB) to score the blocks, and the
   compressed values (4.2 MB) and the window's keys and values (1 MB) for their branches;
2. know every block's score of a KV head before choosing its 16 blocks (a reduction over the
   whole compressed pass), and rank them;
3. read the chosen blocks (16 x 64 tokens of keys and values per KV head, 2.1 MB) - an address
   known only after step 2;
4. merge the per-block partials into each head's output.

This script times steps that do exactly that data movement with trivial arithmetic (sums
instead of dot products and softmax), so each one is a floor for any kernel design with the
same dependencies:

- ``empty``: one 1-program kernel: what a graph replay costs under the timing itself;
- ``stream``: step 1 alone, one launch (all 9.4 MB, or the compressed keys alone);
- ``chain``: three launches (stream + scores; top-16 by ``tl.topk`` + block reads; merge),
  with or without programmatic dependent launch (the library's decode uses it at batch 1), and
  without the ranking (each block's address read from one score: still written by the launch
  before, but no top-n);
- ``one launch``: the same phases in one launch of at most one program an SM, separated by
  grid barriers (an atomic count each); in the ``keys first`` form the first phase reads only
  the compressed keys and the other programs stream the values and the window while the
  chosen blocks are read.

Each synthetic result is checked against the same computation by eager PyTorch ops. The
library's step (``nsa_decode``) and dense SDPA are timed in the same run. Timings are medians
of CUDA-graph replays with the L2 flushed before each, two ways (``gpu_flush_probe.py``):
``zero`` (``triton.testing.do_bench``'s flush, which leaves dirty lines whose write-back runs
inside the timed replay; the tables of this repository use it) and ``read`` (nothing dirty).
(With no flush at all, each replay follows a host synchronisation on an idle GPU, and a
one-program kernel measured 13-25 us: that mode times the wake-up, not the step.)

Usage: ``python scripts/gpu_decode_floor.py [--context 65536] [--reps 300]``; prints markdown.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_decode import CONFIG, D, H, HQ, dense_inputs, graph_of, make_inputs, run_nsa  # noqa: E402
from gpu_flush_probe import median_us  # noqa: E402

TOPN = 16  # blocks chosen per KV head (paper default)
SEL = 64  # tokens a selection block
PROGRAMS = 128  # programs of the one-launch step: at most one an SM on a 132-SM GPU


@triton.jit
def _stream(src, n, share, PER_PROG: tl.constexpr, BLOCK: tl.constexpr):
    """Sum of share ``share`` of ``src``, ``src[share * PER_PROG:][:PER_PROG]`` (elements past
    ``n`` read as zero), ``BLOCK`` elements a step."""
    lo = share.to(tl.int64) * PER_PROG
    hi = lo + PER_PROG
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for off in range(lo, hi, BLOCK):
        idx = off + tl.arange(0, BLOCK)
        acc += tl.load(src + idx, mask=(idx < hi) & (idx < n), other=0.0).to(tl.float32)
    return tl.sum(acc)


@triton.jit
def _write_scores(scores, pid, total, PER: tl.constexpr):
    """Scores ``[pid * PER, pid * PER + PER)`` in [0, 1), each a function of the bytes this
    program summed (``total``), so that the ranking depends on the stream."""
    o = pid * PER + tl.arange(0, PER)
    x = total * 1e-3 + o.to(tl.float32) * 0.6180339887
    tl.store(scores + o, x - tl.floor(x))


@triton.jit
def _gather_block(scores, k, v, part, h, r, H: tl.constexpr, D: tl.constexpr, NBLK: tl.constexpr,
                  TOPN: tl.constexpr, SEL: tl.constexpr, RANK: tl.constexpr):
    """Rank the ``NBLK`` scores of KV head ``h`` (``tl.topk``), read the ``r``-th chosen block
    of keys and values and store the column sums of both as the partial ``part[h, r, :]``.
    Without ``RANK`` the block is ``floor(score[h, r] * NBLK)``: still an address that the
    launch before wrote, but no ranking."""
    if RANK:
        o_j = tl.arange(0, NBLK)
        b_s = tl.load(scores + h * NBLK + o_j, cache_modifier=".cg")  # written by other programs
        key = (b_s.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (NBLK - 1 - o_j).to(tl.int64)
        top = tl.topk(key, TOPN)
        chosen = tl.sum(tl.where(tl.arange(0, TOPN) == r, top, 0))
        blk = NBLK - 1 - (chosen & 0xFFFFFFFF)
    else:
        blk = tl.minimum((tl.load(scores + h * NBLK + r, cache_modifier=".cg") * NBLK).to(tl.int32), NBLK - 1)
    o_t = blk * SEL + tl.arange(0, SEL)
    o_d = tl.arange(0, D)
    off = (o_t.to(tl.int64) * H + h)[:, None] * D + o_d[None, :]
    b_kv = tl.load(k + off).to(tl.float32) + tl.load(v + off).to(tl.float32)
    tl.store(part + (h * TOPN + r) * D + o_d, tl.sum(b_kv, 0))


@triton.jit
def _merge(part, out, q_head, G: tl.constexpr, D: tl.constexpr, TOPN: tl.constexpr):
    """``out[q_head] = sum of its KV head's partials``."""
    h = q_head // G
    o = tl.arange(0, TOPN)[:, None] * D + tl.arange(0, D)[None, :]
    b = tl.load(part + h * TOPN * D + o, cache_modifier=".cg")
    tl.store(out + q_head * D + tl.arange(0, D), tl.sum(b, 0))


@triton.jit
def stream_kernel(src, n, scores, PER_PROG: tl.constexpr, PER: tl.constexpr, BLOCK: tl.constexpr,
                  PDL: tl.constexpr):
    pid = tl.program_id(0)
    if PDL:
        gdc_launch_dependents()
    _write_scores(scores, pid, _stream(src, n, pid, PER_PROG, BLOCK), PER)


@triton.jit
def gather_kernel(scores, k, v, part, rest, n_rest, sink, REST_PER_PROG: tl.constexpr, H: tl.constexpr,
                  D: tl.constexpr, NBLK: tl.constexpr, TOPN: tl.constexpr, SEL: tl.constexpr,
                  BLOCK: tl.constexpr, PDL: tl.constexpr, RANK: tl.constexpr):
    """Programs ``[0, H * TOPN)`` read one chosen block each; any further ones stream ``rest``
    (which needs nothing from the launch before, so they do not wait for it)."""
    pid = tl.program_id(0)
    if PDL:
        gdc_launch_dependents()
    if pid < H * TOPN:
        if PDL:
            gdc_wait()
        _gather_block(scores, k, v, part, pid // TOPN, pid % TOPN, H, D, NBLK, TOPN, SEL, RANK)
    else:
        tl.store(sink + pid - H * TOPN, _stream(rest, n_rest, pid - H * TOPN, REST_PER_PROG, BLOCK))


@triton.jit
def merge_kernel(part, out, G: tl.constexpr, D: tl.constexpr, TOPN: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        gdc_wait()
    _merge(part, out, tl.program_id(0), G, D, TOPN)


@triton.jit
def _grid_barrier(count, P: tl.constexpr):
    """Wait until all ``P`` programs have reached this count (release on arrival, acquire after)."""
    tl.debug_barrier()  # every thread's stores before the arrival (release is cumulative)
    arrived = tl.atomic_add(count, 1, sem="release") + 1
    while arrived < P:
        arrived = tl.atomic_add(count, 0, sem="acquire")


@triton.jit
def one_launch_kernel(first, n_first, rest, n_rest, scores, k, v, part, out, sink, counts,
                      P: tl.constexpr, PER_PROG: tl.constexpr, PER: tl.constexpr, REST_PER_PROG: tl.constexpr,
                      H: tl.constexpr, G: tl.constexpr, D: tl.constexpr, NBLK: tl.constexpr, TOPN: tl.constexpr,
                      SEL: tl.constexpr, BLOCK: tl.constexpr):
    """The three phases in one launch of ``P`` co-resident programs. ``rest`` (``n_rest`` > 0):
    streamed by the programs that read no block while the blocks are read."""
    pid = tl.program_id(0)
    _write_scores(scores, pid, _stream(first, n_first, pid, PER_PROG, BLOCK), PER)
    _grid_barrier(counts, P)
    if pid < H * TOPN:
        _gather_block(scores, k, v, part, pid // TOPN, pid % TOPN, H, D, NBLK, TOPN, SEL, True)
    elif n_rest > 0:
        tl.store(sink + pid - H * TOPN, _stream(rest, n_rest, pid - H * TOPN, REST_PER_PROG, BLOCK))
    _grid_barrier(counts + 1, P)
    if pid < H * G:
        _merge(part, out, pid, G, D, TOPN)
    # the last program out resets the counts for the next launch: every program has left both
    # barriers once it adds here, so none still reads them
    if tl.atomic_add(counts + 2, 1, sem="acq_rel") == P - 1:
        tl.atomic_xchg(counts, 0)
        tl.atomic_xchg(counts + 1, 0)
        tl.atomic_xchg(counts + 2, 0)


@triton.jit
def empty_kernel(x):
    tl.store(x, 1.0)


class Step:
    """The synthetic step's buffers at context ``S``: the compressed keys and values and the
    window as flat bf16 buffers (the keys first), the raw cache, scores, partials, output."""

    def __init__(self, S: int, dev: str = "cuda"):
        bf = torch.bfloat16
        nc = (S - CONFIG.cmp_block) // CONFIG.cmp_stride + 1
        self.n_keys = nc * H * D
        self.n_all = 2 * nc * H * D + 2 * CONFIG.window * H * D
        self.stream_src = torch.randn(self.n_all, device=dev, dtype=bf)  # [compressed keys | values, window]
        self.rest = self.stream_src[self.n_keys:]
        self.k = torch.randn(S, H, D, device=dev, dtype=bf)
        self.v = torch.randn(S, H, D, device=dev, dtype=bf)
        self.nblk = S // SEL  # selection blocks of a KV head (scores per head): a power of two here
        assert self.nblk == triton.next_power_of_2(self.nblk) and H * self.nblk % PROGRAMS == 0
        self.scores = torch.empty(H * self.nblk, device=dev)
        self.part = torch.empty(H * TOPN, D, device=dev)
        self.out = torch.empty(HQ, D, device=dev)
        self.sink = torch.empty(PROGRAMS, device=dev)
        self.counts = torch.zeros(3, device=dev, dtype=torch.int32)
        self.flag = torch.empty(1, device=dev)
        self.block, self.warps = 4096, 4  # how every streaming phase reads: set by main() to the fastest

    def per_prog(self, n: int, programs: int) -> int:
        """Elements a program streams: an even share, whole 16-byte vectors (the last step of
        ``self.block`` elements is masked)."""
        return triton.cdiv(triton.cdiv(n, programs), 1024) * 1024

    # -- the steps -------------------------------------------------------------
    def empty(self) -> None:
        empty_kernel[(1,)](self.flag)

    def stream(self, keys_only: bool, block: int, warps: int, pdl: bool = False) -> None:
        n = self.n_keys if keys_only else self.n_all
        stream_kernel[(PROGRAMS,)](self.stream_src, n, self.scores, self.per_prog(n, PROGRAMS),
                                   H * self.nblk // PROGRAMS, block, pdl, num_warps=warps)

    def chain(self, pdl: bool, keys_first: bool, rank: bool = True) -> None:
        self.stream(keys_first, self.block, self.warps, pdl)
        after = dict(launch_pdl=True) if pdl else {}
        self.gather(pdl, keys_first, after, rank)
        self.merge(pdl, after)

    def gather(self, pdl: bool = False, keys_first: bool = False, after: Optional[dict] = None,
               rank: bool = True) -> None:
        """The second link alone: top-n and one block a program (plus, keys first, the rest of the
        stream in programs of the streaming phases' width; else 4 warps)."""
        extra = PROGRAMS - H * TOPN if keys_first else 0
        gather_kernel[(H * TOPN + extra,)](
            self.scores, self.k, self.v, self.part, self.rest, self.rest.numel() if keys_first else 0, self.sink,
            self.per_prog(self.rest.numel(), max(extra, 1)), H, D, self.nblk, TOPN, SEL, self.block, pdl, rank,
            num_warps=self.warps if keys_first else 4, **(after or {}))

    def merge(self, pdl: bool = False, after: Optional[dict] = None) -> None:
        merge_kernel[(HQ,)](self.part, self.out, HQ // H, D, TOPN, pdl, num_warps=4, **(after or {}))

    def one_launch(self, keys_first: bool, warps: int = 0) -> None:
        """``warps`` 0: the streaming phases' width (one launch has one width for all its phases)."""
        block, n = self.block, (self.n_keys if keys_first else self.n_all)
        extra = PROGRAMS - H * TOPN
        one_launch_kernel[(PROGRAMS,)](
            self.stream_src, n, self.rest, self.rest.numel() if keys_first else 0, self.scores, self.k, self.v,
            self.part, self.out, self.sink, self.counts, PROGRAMS, self.per_prog(n, PROGRAMS),
            H * self.nblk // PROGRAMS, self.per_prog(self.rest.numel(), extra), H, HQ // H, D, self.nblk, TOPN, SEL,
            block, num_warps=warps or self.warps)

    # -- the check ---------------------------------------------------------------
    def expected(self, rank: bool = True) -> torch.Tensor:
        """The merged output by eager ops from the scores the kernels left (the scores themselves
        depend on the summation order of the stream; their ranking and the rest do not)."""
        s = self.scores.view(H, self.nblk)
        if rank:
            blk = torch.topk(s, TOPN, dim=1).indices  # [H, TOPN]
        else:
            blk = (s[:, :TOPN] * self.nblk).to(torch.int64).clamp(max=self.nblk - 1)
        kv = (self.k.float() + self.v.float()).view(-1, SEL, H, D)  # [blocks, SEL, H, D]
        part = torch.stack([kv[blk[h], :, h, :].sum(dim=(0, 1)) for h in range(H)])  # [H, D]
        return part.repeat_interleave(HQ // H, dim=0)


def time_all(fn: Callable[[], object], buf: torch.Tensor, reps: int) -> Dict[str, float]:
    graph = graph_of(fn)
    return {flush: median_us(graph, flush, buf, reps) for flush in ("zero", "read")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--context", type=int, default=65536)
    parser.add_argument("--reps", type=int, default=300)
    args = parser.parse_args()
    S = args.context
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    assert props.multi_processor_count >= PROGRAMS, "the one-launch step needs one program an SM"
    print(f"# Floors of a batch-1 decode step at {S} tokens\n")
    print(f"Device: {props.name} ({props.multi_processor_count} SMs); torch {torch.__version__}, "
          f"triton {triton.__version__}, CUDA {torch.version.cuda}. Medians of {args.reps} graph replays, us.\n")
    buf = torch.empty(256 * 2**20 // 4, device="cuda", dtype=torch.int32)
    step = Step(S)
    print(f"Bytes: compressed keys {2 * step.n_keys / 1e6:.2f} MB, all streamed {2 * step.n_all / 1e6:.2f} MB, "
          f"chosen blocks {H * TOPN * SEL * D * 4 / 1e6:.2f} MB.\n")

    # the streaming phases read as the fastest of these launches reads all the bytes
    configs = [(4096, 4), (16384, 8), (32768, 8), (16384, 16), (32768, 16)]
    speed = {c: median_us(graph_of(lambda c=c: step.stream(False, *c)), "zero", buf, args.reps) for c in configs}
    step.block, step.warps = min(speed, key=speed.get)
    print("Streaming all the bytes, one launch of 128 programs, by (elements a step, warps), zero flush, us: "
          + ", ".join(f"{c} {t:.1f}" for c, t in speed.items())
          + f". Every streaming phase below reads as {(step.block, step.warps)}.\n")

    checks: List[str] = []
    for name, fn, rank in (("chain", lambda: step.chain(True, False), True),
                           ("chain, keys first", lambda: step.chain(True, True), True),
                           ("chain, no ranking", lambda: step.chain(False, False, False), False),
                           ("one launch", lambda: step.one_launch(False), True),
                           ("one launch, keys first", lambda: step.one_launch(True), True)):
        for _ in range(3):  # repeated: a stale count or a stale line would show after the first
            step.out.fill_(float("nan"))
            fn()
        torch.cuda.synchronize()
        want = step.expected(rank)
        err = float((step.out - want).abs().max() / want.abs().max())
        checks.append(f"{name} {err:.1e}")
        assert err < 1e-5, f"{name}: synthetic step wrong ({err})"
        assert int(step.counts.abs().sum()) == 0
    print("Checked against eager ops (max error / max): " + ", ".join(checks) + ".\n")

    rows = [
        ("empty kernel (one program)", step.empty),
        ("stream the compressed keys, 1 launch", lambda: step.stream(True, step.block, step.warps)),
        ("stream all, 1 launch", lambda: step.stream(False, step.block, step.warps)),
        ("second link alone (top-n, one block a program), 1 launch", step.gather),
        ("second link alone, no ranking (the block from one score)", lambda: step.gather(rank=False)),
        ("third link alone (merge), 1 launch", step.merge),
        ("chain of 3 launches, no PDL", lambda: step.chain(False, False)),
        ("chain of 3 launches, no PDL, no ranking", lambda: step.chain(False, False, False)),
        ("chain of 3 launches, PDL", lambda: step.chain(True, False)),
        ("chain, PDL, keys first", lambda: step.chain(True, True)),
        ("one launch, 2 grid barriers", lambda: step.one_launch(False)),
        ("one launch, keys first", lambda: step.one_launch(True)),
        ("one launch, keys first, 8 warps", lambda: step.one_launch(True, 8)),
        ("one launch, keys first, 4 warps", lambda: step.one_launch(True, 4)),
    ]
    t = make_inputs(1, S)
    q, K, V = dense_inputs(1, S)
    rows += [("library step (nsa_decode, default launch)", lambda: run_nsa(t)),
             ("dense SDPA over the whole cache", lambda: F.scaled_dot_product_attention(q, K, V, enable_gqa=True))]
    print("| step | zero (do_bench) | read |\n|---|---:|---:|")
    for _round in range(2):
        for name, fn in rows:
            r = time_all(fn, buf, args.reps)
            print(f"| {name} | {r['zero']:.1f} | {r['read']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
