"""Where each program of a CUDA-graph decode step spends its time: %globaltimer stamps.

The profiler's timeline (``gpu_decode_timeline.py``) gives each launch's span only. This probe
copies ``src/nsa`` into a temporary tree, inserts stamps into the four decode kernels there
(``INSERTS`` below: each program stores its SM and the GPU's global timer at a few points,
after the value it waits for has arrived) and times the library's own launch with that tree:

- compressed pass: start (after its queries' row), end (its partial computed), and when each
  row-group's last program ended;
- score: wait over (``gdc_wait``), keys ready, end (candidates stored);
- selected: before the wait (the forced blocks attended), wait over, candidates loaded, top-n
  placed, end; the window's programs: start, end;
- combine: wait over, end.

It prints, per launch, the stamps' spread across programs (min, median, 90th percentile, max,
us after the first compressed program's start) and the medians of each program's phases,
for a few replays of ``[L2 flush, step]`` graphs. The stamps add a few instructions and one
store each; compare their step with the timeline's, not with the tables.

Usage: ``python scripts/gpu_decode_trace.py [--contexts 65536] [--batches 1 16] [--replays 5]
[--variants '{}' ...]`` (``decode_fwd`` overrides, as ``gpu_decode_timeline.py``).
"""

from __future__ import annotations

import argparse
import atexit
import json
import pathlib
import shutil
import statistics
import sys
import tempfile
from typing import Dict, List, Tuple

ROOT = pathlib.Path(__file__).resolve().parents[1]

STAMP_HELPERS = '''

@triton.jit
def trace_stamp(p_tr, slot, dep):
    """Store the global timer (ns) at ``p_tr[slot]``, once ``dep`` (an int32) has arrived."""
    t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [dep], dtype=tl.int64, is_pure=False, pack=1)
    tl.store(p_tr + slot, t)


@triton.jit
def trace_sm(p_tr):
    """Store this program's SM at ``p_tr[0]``, its program ids at ``p_tr[5]`` and ``p_tr[6]``."""
    sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=True, pack=1)
    tl.store(p_tr, sm.to(tl.int64))
    tl.store(p_tr + 5, tl.program_id(0).to(tl.int64))
    tl.store(p_tr + 6, tl.program_id(1).to(tl.int64))


@triton.jit
def trace_row(trace):
    """This program's 8 slots of ``trace`` (one row per program, grid order)."""
    return trace + (tl.program_id(0) + tl.program_id(1) * tl.num_programs(0)).to(tl.int64) * 8
'''

IMPORT = "from nsa.ops.decode.tiles import trace_row, trace_sm, trace_stamp\n"

# (file under nsa/ops/decode, anchor, text that replaces it): every anchor must occur once
INSERTS: List[Tuple[str, str, str]] = [
    ("tiles.py", None, STAMP_HELPERS),
    # compressed pass
    ("compressed_pass.py", " SEL_BLOCK: tl.constexpr, R: tl.constexpr,\n):", " SEL_BLOCK: tl.constexpr, R: tl.constexpr, trace,\n):"),
    ("compressed_pass.py", "    b_m = tl.full([BG], float(\"-inf\"), tl.float32)\n    b_l = tl.zeros([BG], tl.float32)\n"
     "    b_acc = tl.zeros([BG, BV], tl.float32)\n    if i_s < S_CMP:",
     "    p_tr = trace_row(trace)\n    trace_sm(p_tr)\n    trace_stamp(p_tr, 1, pos.to(tl.int32))\n"
     "    b_m = tl.full([BG], float(\"-inf\"), tl.float32)\n    b_l = tl.zeros([BG], tl.float32)\n"
     "    b_acc = tl.zeros([BG, BV], tl.float32)\n    if i_s < S_CMP:"),
    ("compressed_pass.py", "    store_partial(o_part, m_part, l_part, i_r, i_h, i_s, S, b_m, b_l, b_acc, H * G, G, V, BG, BV, KEEP)\n",
     "    trace_stamp(p_tr, 4, tl.sum(b_l, 0).to(tl.int32, bitcast=True))\n"
     "    store_partial(o_part, m_part, l_part, i_r, i_h, i_s, S, b_m, b_l, b_acc, H * G, G, V, BG, BV, KEEP)\n"),
    # score
    ("score.py", " RUN_BIT: tl.constexpr,\n):", " RUN_BIT: tl.constexpr, trace,\n):"),
    ("score.py", "        gdc_wait()\n    if j0 <= pos // SEL_BLOCK:",
     "        gdc_wait()\n    p_tr = trace_row(trace)\n    trace_sm(p_tr)\n    trace_stamp(p_tr, 1, i_j)\n"
     "    if j0 <= pos // SEL_BLOCK:"),
    ("score.py", "        # -- this tile's candidates: keys with fewer than N larger keys in the tile --\n",
     "        trace_stamp(p_tr, 2, tl.max(b_key, 0).to(tl.int32))\n"
     "        # -- this tile's candidates: keys with fewer than N larger keys in the tile --\n"),
    ("score.py", "        tl.store(p_c + o_n, tl.full([NP], -1, tl.int64), mask=pad)",
     "        tl.store(p_c + o_n, tl.full([NP], -1, tl.int64), mask=pad)\n        trace_stamp(p_tr, 4, n_found)"),
    # selected (and the window's programs of that launch)
    ("selected.py", "    INIT: tl.constexpr, LOCAL: tl.constexpr, FORCED_EARLY: tl.constexpr,\n):\n    \"\"\"With",
     "    INIT: tl.constexpr, LOCAL: tl.constexpr, FORCED_EARLY: tl.constexpr, trace,\n):\n    \"\"\"With"),
    ("selected.py", "    i_rh = tl.program_id(1)\n", "    i_rh = tl.program_id(1)\n    p_tr = trace_row(trace)\n    trace_sm(p_tr)\n"),
    ("selected.py", "        lo, hi = window_split(pos, i_s - S_SLC, S_WIN, WINDOW)\n",
     "        trace_stamp(p_tr, 1, pos.to(tl.int32))\n        lo, hi = window_split(pos, i_s - S_SLC, S_WIN, WINDOW)\n"),
    ("selected.py", "        store_partial(o_part, m_part, l_part, i_r, i_h, WIN_SLOT0 + i_s - S_SLC,",
     "        trace_stamp(p_tr, 4, tl.sum(b_l, 0).to(tl.int32, bitcast=True))\n"
     "        store_partial(o_part, m_part, l_part, i_r, i_h, WIN_SLOT0 + i_s - S_SLC,"),
    ("selected.py", "                          qk_scale, NCAND, SLOT0, S, i_s, i_rh, i_r, i_h, i_b, pos, b_q,\n",
     "                          qk_scale, NCAND, SLOT0, S, i_s, i_rh, i_r, i_h, i_b, pos, b_q, p_tr,\n"),
    ("selected.py", "    qk_scale, NCAND, SLOT0, S, i_s, i_rh, i_r, i_h, i_b, pos, b_q,  #\n",
     "    qk_scale, NCAND, SLOT0, S, i_s, i_rh, i_r, i_h, i_b, pos, b_q, p_tr,  #\n"),
    ("selected.py", "    if PDL:\n        gdc_wait()\n        if LATE_TRIGGER:\n            gdc_launch_dependents()\n",
     "    trace_stamp(p_tr, 7, tl.sum(b_l, 0).to(tl.int32, bitcast=True))\n"
     "    if PDL:\n        gdc_wait()\n        if LATE_TRIGGER:\n            gdc_launch_dependents()\n"
     "    trace_stamp(p_tr, 1, own.to(tl.int32))\n"),
    ("selected.py", "        o_unused, b_key = candidate_keys(p_cand, 0, n_cand, TJ)\n        b_j = top_n_blocks(",
     "        o_unused, b_key = candidate_keys(p_cand, 0, n_cand, TJ)\n"
     "        trace_stamp(p_tr, 2, tl.sum(b_key.to(tl.int32), 0))\n        b_j = top_n_blocks("),
    ("selected.py", "    # -- attention over this program's blocks, positions <= pos --\n",
     "    trace_stamp(p_tr, 3, tl.sum(b_j.to(tl.int32), 0))\n    # -- attention over this program's blocks, positions <= pos --\n"),
    ("selected.py", "    store_partial(o_part, m_part, l_part, i_r, i_h, SLOT0 + i_s, S,",
     "    trace_stamp(p_tr, 4, tl.sum(b_l, 0).to(tl.int32, bitcast=True))\n"
     "    store_partial(o_part, m_part, l_part, i_r, i_h, SLOT0 + i_s, S,"),
    # combine
    ("combine.py", "    DROP: tl.constexpr, GATE_PROJ: tl.constexpr, BKG: tl.constexpr, HAS_BIAS: tl.constexpr,\n):",
     "    DROP: tl.constexpr, GATE_PROJ: tl.constexpr, BKG: tl.constexpr, HAS_BIAS: tl.constexpr, trace,\n):"),
    ("combine.py", "    if PDL:\n        gdc_wait()\n",
     "    if PDL:\n        gdc_wait()\n    p_tr = trace_row(trace)\n    trace_sm(p_tr)\n    trace_stamp(p_tr, 1, HQ)\n"),
    ("combine.py", "    tl.store(o + o_h[:, None] * V + o_v[None, :], b_o.to(o.dtype.element_ty), mask=o_v[None, :] < V)",
     "    trace_stamp(p_tr, 4, tl.sum(tl.sum(b_o, 1), 0).to(tl.int32, bitcast=True))\n"
     "    tl.store(o + o_h[:, None] * V + o_v[None, :], b_o.to(o.dtype.element_ty), mask=o_v[None, :] < V)"),
    # the launches pass each kernel its rows of the module's TRACE
    ("kernel.py", "        num_warps=cmp_warps or num_warps, **cmp_attend,", "        trace=TRACE[0], num_warps=cmp_warps or num_warps, **cmp_attend,"),
    ("kernel.py", "        FAST_LOG2=on_gpu, RUN_BIT=run_bit(tj, NP),\n", "        FAST_LOG2=on_gpu, RUN_BIT=run_bit(tj, NP), trace=TRACE[1],\n"),
    ("kernel.py", "        RANKED=ranked, BITONIC=topn_bitonic, LATE_TRIGGER=combine_early,",
     "        RANKED=ranked, BITONIC=topn_bitonic, LATE_TRIGGER=combine_early, trace=TRACE[2],"),
    ("kernel.py", "        PDL=pdl, DROP=drop,\n", "        PDL=pdl, DROP=drop, trace=TRACE[3],\n"),
    ("kernel.py", "def _batch_fills_gpu(", "TRACE = None  # [4 launches, programs * 8] int64, set by the probe\n\n\ndef _batch_fills_gpu("),
]

SLOTS = {  # stamp slot -> name, per launch
    "cmp": {1: "start", 4: "end"},
    "score": {1: "wait over", 2: "keys", 4: "end"},
    "selected": {7: "before the wait", 1: "wait over", 2: "candidates", 3: "top-n", 4: "end"},
    "combine": {1: "wait over", 4: "end"},
}


def instrumented_tree() -> pathlib.Path:
    """A temporary copy of ``src`` with the stamps inserted; its path, to go first on sys.path."""
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="nsa_trace_"))
    shutil.copytree(ROOT / "src" / "nsa", tmp / "nsa", ignore=shutil.ignore_patterns("__pycache__"))
    decode = tmp / "nsa" / "ops" / "decode"
    for name, anchor, text in INSERTS:
        path = decode / name
        source = path.read_text()
        if anchor is None:
            source += text
        else:
            if source.count(anchor) != 1:
                raise SystemExit(f"{name}: anchor found {source.count(anchor)} times: {anchor!r}")
            source = source.replace(anchor, text)
        path.write_text(source)
    for name in ("compressed_pass.py", "score.py", "selected.py", "combine.py"):
        path = decode / name
        source = path.read_text()
        anchor = "import triton.language as tl\n"
        path.write_text(source.replace(anchor, anchor + IMPORT, 1))
    return tmp


def spread(values: List[float]) -> str:
    v = sorted(values)
    pick = lambda q: v[min(len(v) - 1, int(q * (len(v) - 1) + 0.5))]  # noqa: E731
    return f"{v[0]:6.1f} {statistics.median(v):6.1f} {pick(0.9):6.1f} {v[-1]:6.1f}"


def analyse(trace, names=("cmp", "score", "selected", "combine")) -> Dict[str, Dict[str, List[float]]]:
    """Per launch, per stamp (and per phase of consecutive stamps), us after the first compressed
    program's start, over the programs that stamped (window programs of the selected launch
    apart, as ``window``)."""
    t = trace.view(4, -1, 8)
    t0 = t[0, :, 1][t[0, :, 1] > 0].min()
    out: Dict[str, Dict[str, List[float]]] = {}
    for i, name in enumerate(names):
        rows = t[i][t[i, :, 1] > 0]
        groups = {name: rows}
        if name == "selected":
            groups = {"selected": rows[rows[:, 2] > 0], "window": rows[rows[:, 2] <= 0]}
        for group, r in groups.items():
            if len(r) == 0:
                continue
            slots = SLOTS[name] if group != "window" else {1: "start", 4: "end"}
            stats: Dict[str, List[float]] = {}
            for slot, label in slots.items():
                stats[label] = ((r[:, slot] - t0).double() / 1e3).tolist()
            keys = list(slots)
            for a, b in zip(keys, keys[1:]):
                stats[f"{slots[a]} -> {slots[b]}"] = ((r[:, b] - r[:, a]).double() / 1e3).tolist()
            if name == "cmp":
                # when each row-group's last program of the pass ended: all that a score program
                # waiting for its own row-group alone would wait for (session 53's score_row_wait)
                done: Dict[int, float] = {}
                for row_group, end in zip(r[:, 6].tolist(), ((r[:, 4] - t0).double() / 1e3).tolist()):
                    done[row_group] = max(done.get(row_group, end), end)
                stats["row-group done"] = list(done.values())
            stats["programs"] = [float(len(r))]
            stats["SMs"] = [float(len(set(r[:, 0].tolist())))]
            out[group] = stats
    return out


def placement(trace, by_load: Dict[str, Dict[int, List[float]]], slowest: List[str],
              names=("cmp", "score", "selected", "combine")) -> None:
    """Adds to ``by_load[launch][k]`` the end (us) of every program whose SM ran ``k`` of that
    launch's programs, and to ``slowest`` the compressed pass's five last programs (split, row
    group, SM)."""
    t = trace.view(4, -1, 8)
    t0 = t[0, :, 1][t[0, :, 1] > 0].min()
    for i, name in enumerate(names):
        rows = t[i][(t[i, :, 1] > 0) & (t[i, :, 4] > 0)]
        if name == "selected":
            for group, r in (("selected", rows[rows[:, 2] > 0]), ("window", rows[rows[:, 2] <= 0])):
                _by_sm(group, r, rows, t0, by_load)
        else:
            _by_sm(name, rows, rows, t0, by_load)
    cmp = t[0][t[0, :, 4] > 0]
    last = cmp[cmp[:, 4].argsort(descending=True)[:5]]
    slowest.append(", ".join(f"({int(r[5])}, {int(r[6])}, SM {int(r[0])}: {(r[4] - t0).item() / 1e3:.1f})" for r in last))


def _by_sm(group: str, rows, launch_rows, t0, by_load: Dict[str, Dict[int, List[float]]]) -> None:
    """``rows``' ends by how many of the launch's programs (``launch_rows``) shared their SM."""
    load: Dict[int, int] = {}
    for sm in launch_rows[:, 0].tolist():
        load[sm] = load.get(sm, 0) + 1
    start = int(t0)
    for r in rows.tolist():
        by_load.setdefault(group, {}).setdefault(load[r[0]], []).append((r[4] - start) / 1e3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[65536])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--replays", type=int, default=5)
    parser.add_argument("--variants", nargs="+", default=["{}"], help="JSON dicts of decode_fwd overrides")
    args = parser.parse_args()
    tree = instrumented_tree()
    atexit.register(shutil.rmtree, tree, True)
    sys.path.insert(0, str(tree))
    import torch

    import nsa.ops.decode.kernel as kernel  # the instrumented tree's
    from gpu_decode import graph_of, make_inputs, run_nsa

    assert "nsa_trace_" in kernel.__file__, kernel.__file__
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; stamps: {kernel.__file__}")
    kernel.TRACE = torch.full((4, 16384 * 8), -1, dtype=torch.int64, device="cuda")
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    for B in args.batches:
        for S in args.contexts:
            for variant in args.variants:
                t = make_inputs(B, S)
                graph = graph_of(lambda: run_nsa(t, **json.loads(variant)))
                for _ in range(5):
                    flush.zero_()
                    graph.replay()
                merged: Dict[str, Dict[str, List[float]]] = {}
                by_load: Dict[str, Dict[int, List[float]]] = {}
                slowest: List[str] = []
                for _ in range(args.replays):
                    kernel.TRACE.fill_(-1)
                    flush.zero_()
                    graph.replay()
                    torch.cuda.synchronize()
                    trace = kernel.TRACE.cpu()
                    placement(trace, by_load, slowest)
                    for group, stats in analyse(trace).items():
                        for label, values in stats.items():
                            merged.setdefault(group, {}).setdefault(label, []).extend(values)
                print(f"\nB={B} S={S} {variant}, {args.replays} replays; us after the first compressed program's start "
                      f"(phases: each program's own); min / median / p90 / max", flush=True)
                for group, stats in merged.items():
                    n_prog = int(stats.pop("programs")[0])
                    sms = int(max(stats.pop("SMs")))
                    print(f"  {group} ({n_prog} programs, on {sms} SMs)")
                    for label, values in stats.items():
                        print(f"    {label:>24}: {spread(values)}")
                    loads = by_load.get(group, {})
                    print("    end by the launch's programs on the SM (programs: min / median / max end): " + "; ".join(
                        f"{k}: {len(v) // args.replays} programs, {min(v):.1f} / {statistics.median(v):.1f} / {max(v):.1f}"
                        for k, v in sorted(loads.items())))
                print("  the compressed pass's last five programs (split, row group, SM: end), each replay:")
                for line in slowest:
                    print(f"    {line}")
                del graph, t
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
