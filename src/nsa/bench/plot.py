"""PNG plots of the ``nsa-bench`` tables (matplotlib, Agg backend: no display needed).

- decode: latency per step against context, NSA and dense per batch size, log-log, each
  batch in its own line style and marker, dense / NSA written at its longest context, with
  the stored baseline's points drawn in (dotted, hollow markers);
- prefill: speedup of NSA over dense against length, forward and forward+backward,
  with the baseline's speedups drawn in the same way;
- packed: NSA and dense milliseconds per kind of pack, forward and forward+backward side by
  side, each pair labelled with dense / NSA (no baseline: packs are not pytest points).
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Mapping, Optional, Sequence

#: ``{series label: {x: y}}``: what the baseline contributes to a plot.
Series = Mapping[str, Mapping[int, float]]


def _axes(title: str, xlabel: str, ylabel: str, *, log_x: bool = True):
    import matplotlib

    matplotlib.use("Agg")  # file output only; never needs a display
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=120)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if log_x:
        ax.set_xscale("log", base=2)
        ax.grid(True, which="both", alpha=0.3)
    else:
        ax.grid(True, axis="y", alpha=0.3)
    return fig, ax


def _log_y(ax) -> None:
    """Log y axis with plain-number labels at 1-2-5 steps (one decade has few major ticks)."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))


def _size_label(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def _finish(fig, ax, xs: Sequence[int], path: Path) -> None:
    ticks = sorted(set(xs))
    ax.set_xticks(ticks)
    ax.set_xticklabels([_size_label(x) for x in ticks])
    ax.minorticks_off()
    _save(fig, ax, path)


def _save(fig, ax, path: Path) -> None:
    ax.legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    import matplotlib.pyplot as plt

    plt.close(fig)


def _draw_baseline(ax, baseline: Optional[Series], colors: Dict[str, str]) -> None:
    for label, points in (baseline or {}).items():
        xs = sorted(points)
        color = colors.get(label.split(" ")[0], "grey")
        ax.plot(xs, [points[x] for x in xs], ":", marker="o", mfc="none", color=color, alpha=0.7,
                label=f"{label} (baseline)")  # fmt: skip


#: Line styles and markers of the batch sizes of a decode plot, in ascending batch order (dotted
#: lines are the baseline's).
BATCH_LINES = ("-", "--", "-.", (0, (6, 2, 1, 2, 1, 2)), (0, (8, 3)))
BATCH_MARKERS = ("o", "s", "^", "D", "v")


def batch_styles(batches: Sequence[int]) -> Dict[int, tuple]:
    """``{batch: (line style, marker)}``, distinct for up to ``len(BATCH_LINES)`` batch sizes
    (then repeating), so that NSA and dense of one batch share a style and batches differ."""
    ordered = sorted(set(batches))
    return {b: (BATCH_LINES[i % len(BATCH_LINES)], BATCH_MARKERS[i % len(BATCH_MARKERS)]) for i, b in enumerate(ordered)}


def decode_plot(rows: Sequence[Mapping[str, object]], baseline: Optional[Series], path: Path, title: str) -> None:
    """Latency (ms) against context from decode ``rows`` (``batch``, ``context``, ``nsa_ms``,
    ``dense_ms``); ``baseline`` keys look like ``"NSA B=1"``/``"dense B=1"``. Each batch's
    dense / NSA at its longest context is written beside its NSA point."""
    fig, ax = _axes(title, "context (tokens)", "ms per decode step")
    _log_y(ax)
    colors: Dict[str, str] = {"NSA": "tab:blue", "dense": "tab:orange"}
    styles = batch_styles([int(r["batch"]) for r in rows])
    for batch, (line, marker) in styles.items():
        mine = [r for r in rows if int(r["batch"]) == batch and r.get("status") == "ok"]
        if not mine:
            continue
        xs = [int(r["context"]) for r in mine]
        nsa, dense = [float(r["nsa_ms"]) for r in mine], [float(r["dense_ms"]) for r in mine]
        ax.plot(xs, nsa, linestyle=line, marker=marker, color=colors["NSA"], label=f"NSA B={batch}")
        ax.plot(xs, dense, linestyle=line, marker=marker, mfc="white", color=colors["dense"],
                label=f"dense SDPA B={batch}")  # fmt: skip
        ax.annotate(f"{dense[-1] / nsa[-1]:.2f}x", (xs[-1], nsa[-1]), xytext=(6, -3), textcoords="offset points",
                    fontsize=7, color=colors["NSA"])  # fmt: skip
    _draw_baseline(ax, baseline, colors)
    _finish(fig, ax, [int(r["context"]) for r in rows], path)


def baseline_from_rows(rows: Sequence[Mapping[str, object]]) -> Dict[str, Dict[int, float]]:
    """The baseline series stored in a table's ``baseline_*`` columns (for re-plotting a CSV)."""
    series: Dict[str, Dict[int, float]] = {}
    for row in rows:
        pairs = ((f"NSA B={row.get('batch')}", "baseline_nsa_ms"), (f"dense B={row.get('batch')}", "baseline_dense_ms"),
                 ("fwd", "baseline_fwd_speedup"), ("fwd+bwd", "baseline_fwdbwd_speedup"))  # fmt: skip
        x = int(row.get("context") or row.get("length") or 0)
        for label, column in pairs:
            if row.get(column) not in (None, ""):
                series.setdefault(label, {})[x] = float(row[column])  # type: ignore[arg-type]
    return series


def prefill_plot(rows: Sequence[Mapping[str, object]], baseline: Optional[Series], path: Path, title: str) -> None:
    """Speedup over dense (dense ms / NSA ms) against length from prefill ``rows``
    (``length``, ``fwd_speedup``, ``fwdbwd_speedup``); ``baseline`` keys ``"fwd"``/``"fwd+bwd"``."""
    fig, ax = _axes(title, "sequence length (tokens)", "speedup of NSA over dense SDPA (x)")
    ax.axhline(1.0, color="black", linewidth=0.8, alpha=0.6)
    colors = {"fwd": "tab:blue", "fwd+bwd": "tab:green"}
    ok = [r for r in rows if r.get("status") == "ok"]
    xs = [int(r["length"]) for r in ok]
    ax.plot(xs, [float(r["fwd_speedup"]) for r in ok], "-", marker="o", color=colors["fwd"], label="fwd")
    ax.plot(xs, [float(r["fwdbwd_speedup"]) for r in ok], "-", marker="s", color=colors["fwd+bwd"], label="fwd+bwd")
    _draw_baseline(ax, baseline, colors)
    _finish(fig, ax, [int(r["length"]) for r in rows], path)


def packed_plot(rows: Sequence[Mapping[str, object]], path: Path, title: str) -> None:
    """Bars of NSA and dense ms per pack from packed ``rows`` (``pack``, ``sequences``,
    ``median_length``, ``nsa_fwd_ms``, ``dense_fwd_ms``, ``nsa_fwdbwd_ms``, ``dense_fwdbwd_ms``):
    forward, then forward+backward (hatched), each pair labelled with dense / NSA."""
    ok = [r for r in rows if r.get("status") == "ok"]
    fig, ax = _axes(title, "pack (labels over each pair: dense / NSA)", "ms per call", log_x=False)
    width = 0.2
    colors = {"nsa": "tab:blue", "dense": "tab:orange"}
    for first, mode, shown, hatch in ((-2, "fwd", "fwd", ""), (0, "fwdbwd", "fwd+bwd", "//")):
        for shift, impl, name in ((first, "nsa", "NSA"), (first + 1, "dense", "dense")):
            xs = [i + (shift + 0.5) * width for i in range(len(ok))]
            ax.bar(xs, [float(r[f"{impl}_{mode}_ms"]) for r in ok], width, label=f"{name} {shown}", hatch=hatch,
                   color=colors[impl], edgecolor="white")  # fmt: skip
        for i, r in enumerate(ok):
            nsa, dense = float(r[f"nsa_{mode}_ms"]), float(r[f"dense_{mode}_ms"])
            ax.annotate(f"{dense / nsa:.2f}x", (i + (first + 1) * width, max(nsa, dense)), ha="center", va="bottom",
                        fontsize=7, xytext=(0, 2), textcoords="offset points")  # fmt: skip
    ax.set_xticks(range(len(ok)))
    ax.set_xticklabels([f"{r['pack']}\n{r['sequences']} seqs, median {r['median_length']}" for r in ok], fontsize=8)
    _save(fig, ax, path)
