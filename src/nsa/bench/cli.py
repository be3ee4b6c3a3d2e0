"""``nsa-bench``: decode, prefill and packed-batch tables, CSV and plots, outside pytest.

Examples::

    nsa-bench decode --contexts 8k,16k,32k,64k --batch 1,16 --csv decode.csv --plot decode.png
    nsa-bench prefill --lengths 8k,16k,32k --csv prefill.csv --plot prefill.png
    nsa-bench packed --total 64k --packs lognormal,long,uniform,one_long --csv packed.csv --plot packed.png

Defaults (contexts, lengths, batch sizes, rounds) come from the GPU profile that
matches the device (``--profile``), shapes from the device (64 query heads, 4 KV
heads, head dim 128, bf16 on a GPU; a small float32 shape on the CPU). Timing is
:mod:`nsa.bench.timing`'s; the per-branch columns of the decode table time each
branch's op alone. Prefill calls are queued back to back, so each sample is the
call's device time as ``triton.testing.do_bench`` takes it (``--sync-calls``: each
call from an idle device instead, the host's launches included). ``--baseline auto`` draws the profile's stored baseline
(``gpu_profiles/baselines/<profile>/benchmarks.json``, written by
``pytest tests/benchmarks --nsa-baseline=save``) into the plot, for the points of
the same shape; a baseline from another machine is refused with the reason.
``packed`` times packs of documents (``cu_seqlens``, :func:`nsa.bench.workloads.pack_lengths`)
against causal dense attention over the same pack, forward and forward+backward.
Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from nsa.bench import baselines, plot
from nsa.bench.timing import Runner, Samples, measure_within
from nsa.bench.workloads import (
    BRANCHES, DECODE_OPS, PACK_KINDS, PREFILL_OPS, Shape, branch_runners, decode_reads, decode_runner,
    default_config, describe_config, graph_status, pack_lengths, packed_runner, parse_dtype, point_info,
    prefill_runner, routes,
)  # fmt: skip
from nsa.ops import varlen

FALLBACK = {"contexts": (4096, 8192, 16384, 32768, 65536), "batch_sizes": (1,), "rounds": 20,
            "prefill_lengths": (8192, 16384, 32768)}  # fmt: skip
DECODE_COLUMNS = ("batch", "context", "mode", "status", "rounds", "nsa_ms", "nsa_iqr_ms", "branch_mode",
                  *(f"{b}_ms" for b in BRANCHES), "reads_actual", "reads_expected", "dense_ms", "dense_iqr_ms",
                  "nsa_over_dense", "baseline_nsa_ms", "baseline_dense_ms")  # fmt: skip
PREFILL_COLUMNS = ("batch", "length", "status", "rounds", "nsa_fwd_ms", "dense_fwd_ms", "dense_fwd_backend",
                   "fwd_speedup", "nsa_fwdbwd_ms", "dense_fwdbwd_ms", "dense_fwdbwd_backend", "fwdbwd_speedup", "baseline_fwd_speedup",
                   "baseline_fwdbwd_speedup", "timing")  # fmt: skip
PACKED_COLUMNS = ("pack", "total", "sequences", "median_length", "batches", "padded_ratio", "status", "rounds",
                  "nsa_fwd_ms", "dense_fwd_ms", "fwd_speedup", "nsa_fwdbwd_ms", "dense_fwdbwd_ms", "fwdbwd_speedup",
                  "dense", "boundaries", "timing")  # fmt: skip


def parse_sizes(text: str) -> Tuple[int, ...]:
    """``"8k,16k,512"`` -> ``(8192, 16384, 512)`` (``k`` = 1024, ``m`` = 1024**2)."""
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        scale = {"k": 1024, "m": 1024**2}.get(part[-1:], 1)
        digits = part[:-1] if scale > 1 else part
        if not digits.isdigit() or int(digits) <= 0:
            raise argparse.ArgumentTypeError(f"expected sizes like 8k,16k,512; got {text!r}")
        out.append(int(digits) * scale)
    return tuple(out)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nsa-bench", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plot", help="re-draw the plot of a CSV written by 'decode', 'prefill' or 'packed'")
    p.add_argument("--csv", type=Path, required=True, help="the table (its baseline_* columns are drawn too)")
    p.add_argument("--plot", type=Path, required=True, help="the PNG to write")
    p.add_argument("--title", default="", help="plot title")
    for name, what in (("decode", "one decode step per context"), ("prefill", "forward and forward+backward"),
                       ("packed", "packs of documents (cu_seqlens), forward and forward+backward")):
        p = sub.add_parser(name, help=f"time NSA against dense attention: {what}")
        if name == "decode":
            p.add_argument("--contexts", type=parse_sizes, help="contexts, e.g. 8k,16k (default: the profile's)")
            p.add_argument("--graph", action="store_true", help="replay CUDA graphs (where the decode route allows)")
            p.add_argument("--no-branches", action="store_true", help="skip timing each branch alone")
        else:
            if name == "prefill":
                p.add_argument("--lengths", type=parse_sizes, help="sequence lengths (default: the profile's)")
            else:
                p.add_argument("--total", type=parse_sizes, help="tokens a pack (default 64k on GPU, 2k on CPU)")
                p.add_argument("--packs", default=",".join(PACK_KINDS),
                               help=f"kinds of pack, of {', '.join(PACK_KINDS)} (default: all)")
                p.add_argument("--seed", type=int, default=0, help="seed of the documents' lengths (default 0)")
                p.add_argument("--device-boundaries", action="store_true",
                               help="cu_seqlens on the device (read back each call: a sync) instead of the host")
            p.add_argument("--sync-calls", action="store_true",
                           help="start each call on an idle device, so the host's launches count (default: calls "
                                "queued back to back, device time as triton.testing.do_bench takes it)")
        if name != "packed":
            p.add_argument("--batch", type=parse_sizes, help="batch sizes, e.g. 1,16 (default: the profile's; prefill 1)")
        p.add_argument("--heads", type=int, help="query heads (default 64 on GPU)")
        p.add_argument("--kv-heads", type=int, help="key/value heads (default 4 on GPU)")
        p.add_argument("--head-dim", type=int, help="head dimension (default 128 on GPU)")
        p.add_argument("--dtype", type=parse_dtype, help="bf16, fp16 or fp32 (default bf16 on GPU)")
        p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
        p.add_argument("--profile", default="auto", help="GPU profile for defaults and the baseline (default: match)")
        p.add_argument("--rounds", type=int, help="timed calls per point (default: the profile's)")
        p.add_argument("--warmup", type=int, help="untimed calls first (default 10 on GPU, 1 on CPU)")
        p.add_argument("--budget", type=float, default=30.0, help="seconds per measurement; fewer rounds beyond")
        p.add_argument("--sets", type=int, help="input sets to rotate (default: enough to exceed 2x L2)")
        p.add_argument("--no-flush", action="store_true", help="do not flush L2 before each call")
        p.add_argument("--csv", type=Path, help="write the table as CSV")
        if name != "packed":  # the pytest baselines hold decode and prefill points
            p.add_argument("--baseline", default="auto", help="'auto' (the profile's), 'none', or a baseline JSON path")
        p.add_argument("--plot", type=Path, help="write a PNG plot")
    return parser


class Bench:
    """One invocation: device, profile, shape defaults, measuring and progress."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        want = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        self.device = torch.device(want)
        self.profile, self.machine = _profile(args.profile, self.device)
        self.settings = self.profile.benchmark if self.profile is not None else None
        self.config = default_config(self.device)
        self.warmup = args.warmup if args.warmup is not None else (10 if self.device.type == "cuda" else 1)
        self.rounds = args.rounds or (self.settings.rounds if self.settings else FALLBACK["rounds"])

    def setting(self, name: str, given: Optional[Sequence[int]]) -> Tuple[int, ...]:
        if given:
            return tuple(given)
        return tuple(getattr(self.settings, name)) if self.settings else FALLBACK[name]

    def shape(self, batch: int, length: int) -> Shape:
        base = Shape.default(self.device, batch, length)
        a = self.args
        return Shape(batch, length, a.heads or base.heads, a.kv_heads or base.kv_heads, a.head_dim or base.head_dim,
                     a.dtype or base.dtype)  # fmt: skip

    def time(self, runner: Runner) -> Samples:
        return measure_within(runner, rounds=self.rounds, warmup=self.warmup, budget_s=self.args.budget)

    def runner_kwargs(self) -> Dict[str, Any]:
        return {"flush_l2": not self.args.no_flush, "sets": self.args.sets}

    def title(self, what: str, shape: Shape) -> str:
        name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else self.machine["device"]
        return (f"{what} on {name}, torch {self.machine['torch']}, triton {self.machine['triton']}\n"
                f"HQ={shape.heads} H={shape.kv_heads} D={shape.head_dim} {point_info(shape, self.config)['dtype']}, "
                f"{describe_config(self.config)}")  # fmt: skip


def _profile(name: str, device: torch.device) -> Tuple[Any, Dict[str, Any]]:
    """The profile (``None`` if no profile matches) and the machine fields of this run."""
    from pytest_nsa import hardware, versions  # the plugin's pure modules (no pytest import)
    from pytest_nsa.profiles import SHIPPED_DIR, Catalog
    from pytest_nsa.selection import CPU_PROFILE, auto

    catalog = Catalog([Path.cwd() / "gpu_profiles", SHIPPED_DIR])
    hw = hardware.detect()
    if name != "auto":
        profile = catalog.load(name)
    elif device.type == "cpu":
        profile = catalog.load(CPU_PROFILE)
    else:
        profile, why = auto(catalog, hw)
        if profile is None:
            _progress(f"no GPU profile matches ({why}); built-in defaults, no baseline")
    label = profile.name if profile is not None else "none"
    return profile, baselines.machine_fields(label, hw, versions.detect())


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _progress_routes(ops: Sequence[str], bench: "Bench", shape: Shape) -> None:
    _progress("routes: " + " ".join(f"{op}={b}" for op, b in routes(ops, bench.device, shape.dtype).items()))


def _ms(samples: Samples) -> Tuple[float, float]:
    return samples.median * 1e3, samples.iqr * 1e3


def _load_baseline(bench: Bench) -> Optional[baselines.Baseline]:
    choice = bench.args.baseline
    if choice == "none" or (choice == "auto" and bench.profile is None):
        return None
    if choice == "auto":
        folder = Path.cwd() / "gpu_profiles" / "baselines"
        if not folder.is_dir():
            from pytest_nsa.profiles import SHIPPED_DIR

            folder = SHIPPED_DIR / "baselines"
        path = baselines.path_for(folder, bench.profile.name)
    else:
        path = Path(choice)
    try:
        stored = baselines.load(path)
    except FileNotFoundError:
        _progress(f"baseline: none at {path}")
        return None
    except baselines.BaselineError as err:
        _progress(f"baseline: not used: {err}")
        return None
    diff = baselines.differences(stored.machine, bench.machine)
    if diff:
        _progress(f"baseline: {path} refused (another device or software stack): {'; '.join(diff)}")
        return None
    _progress(f"baseline: {path} (recorded {stored.created})")
    return stored


def _baseline_points(stored: Optional[baselines.Baseline], kind: str, match: Callable[[Dict[str, Any]], bool]
                     ) -> Dict[Tuple[str, str, int, int], float]:  # fmt: skip
    """``{(impl, mode, batch, length): median seconds}`` of the stored ``kind`` entries that ``match``."""
    out = {}
    for entry in (stored.entries.values() if stored else ()):
        info, shape = entry.info, entry.info.get("shape") or {}
        if info.get("kind") == kind and match(shape):
            out[(info.get("impl"), info.get("mode"), shape.get("batch"), shape.get("length"))] = entry.median
    return out


def _same_geometry(bench: Bench, shape: Shape) -> Callable[[Dict[str, Any]], bool]:
    mine = point_info(shape, bench.config)
    keys = ("heads", "kv_heads", "head_dim", "dtype", "config")
    return lambda stored: all(stored.get(k) == mine[k] for k in keys)


def _decode_point(bench: Bench, shape: Shape, graph: bool) -> Dict[str, Any]:
    kw = bench.runner_kwargs()
    row: Dict[str, Any] = {"batch": shape.batch, "context": shape.length, "mode": "graph" if graph else "eager"}
    with torch.no_grad():
        nsa = bench.time(decode_runner("nsa", shape, bench.config, bench.device, graph=graph, **kw))
        row["nsa_ms"], row["nsa_iqr_ms"] = _ms(nsa)
        if not bench.args.no_branches:  # each branch's op alone, eager (the ops are not fused or captured)
            row["branch_mode"] = "eager"
            for name, runner in branch_runners(shape, bench.config, bench.device, **kw).items():
                row[f"{name}_ms"] = bench.time(runner).median * 1e3
        row["reads_actual"], row["reads_expected"] = decode_reads(shape, bench.config, bench.device)
        dense = bench.time(decode_runner("dense", shape, bench.config, bench.device, graph=graph, **kw))
    row["dense_ms"], row["dense_iqr_ms"] = _ms(dense)
    row["nsa_over_dense"] = nsa.median / dense.median
    row["rounds"] = len(nsa.times)
    return row


def _prefill_point(bench: Bench, shape: Shape) -> Dict[str, Any]:
    row: Dict[str, Any] = {"batch": shape.batch, "length": shape.length}
    kw = dict(bench.runner_kwargs(), queued=not bench.args.sync_calls)
    # On a GPU, dense is the faster of SDPA's flash and cuDNN backends, each measured here.
    dense_impls = ("dense_flash", "dense_cudnn") if bench.device.type == "cuda" else ("dense",)
    for mode, backward in (("fwd", False), ("fwdbwd", True)):
        times = {impl: bench.time(prefill_runner(impl, shape, bench.config, bench.device, backward=backward, **kw))
                 for impl in ("nsa", *dense_impls)}  # fmt: skip
        fastest = min(dense_impls, key=lambda impl: times[impl].median)
        row[f"nsa_{mode}_ms"], row[f"dense_{mode}_ms"] = times["nsa"].median * 1e3, times[fastest].median * 1e3
        row[f"dense_{mode}_backend"] = fastest.replace("dense_", "") if fastest != "dense" else "sdpa"
        row[f"{mode}_speedup"] = times[fastest].median / times["nsa"].median
        row["rounds"] = len(times["nsa"].times)
        row["timing"] = times["nsa"].method
    return row


def _packed_point(bench: Bench, kind: str, total: int) -> Dict[str, Any]:
    lengths = pack_lengths(kind, total, bench.args.seed)
    groups = varlen.length_classes(lengths)
    row: Dict[str, Any] = {
        "pack": kind, "total": total, "sequences": len(lengths), "median_length": sorted(lengths)[len(lengths) // 2],
        "batches": len(groups), "padded_ratio": sum(len(g) * max(lengths[i] for i in g) for g in groups) / total,
        "boundaries": "device" if bench.args.device_boundaries else "host",
    }  # fmt: skip
    shape = bench.shape(1, total)
    kw = dict(bench.runner_kwargs(), queued=not bench.args.sync_calls)
    for mode, backward in (("fwd", False), ("fwdbwd", True)):
        times = {}
        for impl in ("nsa", "dense"):
            runner, what = packed_runner(impl, shape, lengths, bench.config, bench.device, backward=backward,
                                         host_boundaries=not bench.args.device_boundaries, **kw)  # fmt: skip
            times[impl] = bench.time(runner)
        row[f"nsa_{mode}_ms"], row[f"dense_{mode}_ms"] = times["nsa"].median * 1e3, times["dense"].median * 1e3
        row[f"{mode}_speedup"] = times["dense"].median / times["nsa"].median
        row["dense"], row["rounds"], row["timing"] = what, len(times["nsa"].times), times["nsa"].method
    return row


def _run_points(points: Sequence[Any], measure_one: Callable[[Any], Dict[str, Any]], describe: Callable[[Any], str],
                key: Callable[[Any], Dict[str, Any]]) -> List[Dict[str, Any]]:  # fmt: skip
    """One row a point, with progress: ``describe(point)`` names it, ``key(point)`` the columns
    that identify it in a row whose measurement ran out of memory."""
    rows = []
    for i, point in enumerate(points, 1):
        _progress(f"[{i}/{len(points)}] {describe(point)} ...")
        try:
            row = {**measure_one(point), "status": "ok"}
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            row = {**key(point), "status": "oom"}
        shown = {k: v for k, v in row.items() if k.endswith(("_ms", "speedup", "over_dense")) or k == "status"}
        _progress("    " + ", ".join(f"{k}={_fmt(v)}" for k, v in shown.items()))
        rows.append(row)
    return rows


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def _emit(rows: List[Dict[str, Any]], columns: Sequence[str], args: argparse.Namespace) -> None:
    table = [[_fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(t[i]) for t in table)) for i, c in enumerate(columns)]
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths)))
    for t in table:
        print("  ".join(v.rjust(w) for v, w in zip(t, widths)))
    if args.csv:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        with open(args.csv, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(columns), extrasaction="ignore")
            writer.writeheader()
            writer.writerows({c: _fmt(r.get(c)) for c in columns} for r in rows)
        _progress(f"wrote {args.csv}")


def run_decode(bench: Bench) -> List[Dict[str, Any]]:
    args = bench.args
    contexts = bench.setting("contexts", args.contexts)
    points = [bench.shape(b, s) for b in bench.setting("batch_sizes", args.batch) for s in contexts]
    graph = args.graph
    if graph:
        for impl in ("nsa", "dense"):
            ok, why = graph_status(impl, bench.device, points[0].dtype)
            if not ok:
                _progress(f"--graph ignored: {impl}: {why}")
                graph = False
    _progress_routes(DECODE_OPS, bench, points[0])
    rows = _run_points(points, lambda shape: _decode_point(bench, shape, graph),
                       lambda shape: f"decode B={shape.batch} S={shape.length}",
                       lambda shape: {"batch": shape.batch, "context": shape.length})  # fmt: skip
    stored = _baseline_points(_load_baseline(bench), "decode", _same_geometry(bench, points[0]))
    mode = "graph" if graph else "eager"
    series: Dict[str, Dict[int, float]] = {}
    for row in rows:
        for impl, label in (("nsa", "NSA"), ("dense", "dense")):
            base = stored.get((impl, mode, row["batch"], row["context"]))
            row[f"baseline_{impl}_ms"] = None if base is None else base * 1e3
            if base is not None:
                series.setdefault(f"{label} B={row['batch']}", {})[row["context"]] = base * 1e3
    _emit(rows, DECODE_COLUMNS, args)
    if args.plot:
        plot.decode_plot(rows, series, args.plot, bench.title(f"NSA decode ({mode})", points[0]))
        _progress(f"wrote {args.plot} ({sum(len(s) for s in series.values())} baseline points drawn)")
    return rows


def run_prefill(bench: Bench) -> List[Dict[str, Any]]:
    args = bench.args
    batch = (args.batch or (1,))[0]
    points = [bench.shape(batch, t) for t in bench.setting("prefill_lengths", args.lengths)]
    _progress_routes(PREFILL_OPS, bench, points[0])
    rows = _run_points(points, lambda shape: _prefill_point(bench, shape),
                       lambda shape: f"prefill B={shape.batch} T={shape.length}",
                       lambda shape: {"batch": shape.batch, "length": shape.length})  # fmt: skip
    stored = _baseline_points(_load_baseline(bench), "prefill", _same_geometry(bench, points[0]))
    series: Dict[str, Dict[int, float]] = {}
    for row in rows:
        for mode, column in (("fwd", "fwd"), ("fwd+bwd", "fwdbwd")):
            nsa, dense = (stored.get((impl, mode, batch, row["length"])) for impl in ("nsa", "dense"))
            row[f"baseline_{column}_speedup"] = dense / nsa if nsa and dense else None
            if nsa and dense:
                series.setdefault(mode, {})[row["length"]] = dense / nsa
    _emit(rows, PREFILL_COLUMNS, args)
    if args.plot:
        plot.prefill_plot(rows, series, args.plot, bench.title("NSA prefill speedup over dense", points[0]))
        _progress(f"wrote {args.plot} ({sum(len(s) for s in series.values())} baseline points drawn)")
    return rows


def run_packed(bench: Bench) -> List[Dict[str, Any]]:
    args = bench.args
    total = (args.total or ((65536,) if bench.device.type == "cuda" else (2048,)))[0]
    kinds = [k.strip() for k in args.packs.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in PACK_KINDS]
    if unknown or not kinds:
        raise ValueError(f"--packs takes kinds of {', '.join(PACK_KINDS)}, got {args.packs!r}")
    _progress_routes(PREFILL_OPS, bench, bench.shape(1, total))
    rows = _run_points(kinds, lambda kind: _packed_point(bench, kind, total),
                       lambda kind: f"packed {kind} of {total} tokens", lambda kind: {"pack": kind, "total": total})
    _emit(rows, PACKED_COLUMNS, args)
    if args.plot:
        dense = rows[0].get("dense", "dense") if rows else "dense"
        plot.packed_plot(rows, args.plot, bench.title(f"Packs of {total} tokens, NSA and {dense}", bench.shape(1, total)))
        _progress(f"wrote {args.plot}")
    return rows


def replot(args: argparse.Namespace) -> None:
    """``nsa-bench plot``: the decode or prefill plot of a CSV table, without measuring."""
    with open(args.csv, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    if not rows:
        raise SystemExit(f"nsa-bench plot: {args.csv} has no rows")
    if "pack" in rows[0]:
        plot.packed_plot(rows, args.plot, args.title)
    else:
        draw = plot.decode_plot if "context" in rows[0] else plot.prefill_plot
        draw(rows, plot.baseline_from_rows(rows), args.plot, args.title)
    _progress(f"wrote {args.plot}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``nsa-bench``; returns the exit status (2 for a bad argument or profile)."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "plot":
            replot(args)
        else:
            {"decode": run_decode, "prefill": run_prefill, "packed": run_packed}[args.command](Bench(args))
    except ValueError as err:  # user input: bad shapes or counts, an unknown profile (ProfileError)
        parser.exit(2, f"nsa-bench: error: {err}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
