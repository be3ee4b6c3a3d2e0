"""The report's PNG plots: decode latency against context, prefill speedup against length.

No pytest import here. Inputs are the timed benchmarks of the run as
``{name: entry}`` with ``entry.median`` (seconds) and ``entry.info`` (the
benchmark's ``extra_info``: ``kind``, ``impl``, ``mode``, ``shape`` with ``batch``
and ``length``, and for NSA points ``nsa_over_dense``, the ratio of medians with
dense measured beside it in the same run; see ``tests/benchmarks/_records.py``).
Figures are drawn with matplotlib's object API on an Agg canvas, so pyplot's
global backend is left alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

DECODE_PLOT = "decode_latency.png"
PREFILL_PLOT = "prefill_speedup.png"
#: Line style per series: NSA solid, dense dotted, the stored NSA baseline dashed.
STYLES: Dict[str, Dict[str, Any]] = {
    "NSA": {"linestyle": "-", "marker": "o"},
    "dense": {"linestyle": ":", "marker": "s"},
    "NSA baseline": {"linestyle": "--", "marker": "x"},
}

Series = Dict[str, List[Tuple[int, float]]]


def _point(entry: Any) -> Optional[Tuple[str, str, int, int]]:
    """``(impl, mode, batch, length)`` of a benchmark, ``None`` when its info lacks them."""
    info, shape = entry.info, entry.info.get("shape")
    if not isinstance(shape, Mapping) or not {"batch", "length"} <= set(shape):
        return None
    return str(info.get("impl", "?")), str(info.get("mode", "")), int(shape["batch"]), int(shape["length"])


def decode_series(entries: Mapping[str, Any], baseline: Mapping[str, float]) -> Dict[Tuple[int, str], Series]:
    """Decode latency points per ``(batch, mode)``: ``{"NSA"|"dense"|"NSA baseline": [(context, seconds)]}``,
    sorted by context. ``baseline`` maps benchmark names to the stored median."""
    panels: Dict[Tuple[int, str], Series] = {}
    for name, entry in entries.items():
        point = _point(entry)
        if entry.info.get("kind") != "decode" or point is None or point[0] not in ("nsa", "dense"):
            continue
        impl, mode, batch, context = point
        series = panels.setdefault((batch, mode), {})
        series.setdefault("NSA" if impl == "nsa" else "dense", []).append((context, entry.median))
        if impl == "nsa" and baseline.get(name) is not None:
            series.setdefault("NSA baseline", []).append((context, baseline[name]))
    return {key: {label: sorted(pts) for label, pts in s.items()} for key, s in sorted(panels.items())}


def prefill_series(entries: Mapping[str, Any]) -> Series:
    """Prefill speedup of NSA over dense per mode (``fwd``, ``fwd+bwd``): ``[(length, dense/NSA)]``."""
    series: Series = {}
    for entry in entries.values():
        point = _point(entry)
        ratio = entry.info.get("nsa_over_dense")
        if entry.info.get("kind") != "prefill" or point is None or point[0] != "nsa" or not ratio:
            continue
        series.setdefault(point[1] or "prefill", []).append((point[3], 1.0 / float(ratio)))
    return {mode: sorted(points) for mode, points in sorted(series.items())}


def _figure(panels: int) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.0 * panels, 4.0), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def tokens(n: int) -> str:
    """Axis label of a length: ``512``, ``4k``, ``64k``, ``1M``."""
    for unit, scale in (("M", 2**20), ("k", 2**10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def _length_axis(ax: Any, xs: List[int], label: str) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [tokens(x) for x in xs])
    ax.set_xlabel(label)


def draw_decode(panels: Mapping[Tuple[int, str], Series], path: Path, title: str) -> None:
    """One panel per ``(batch, mode)``; log-log axes, microseconds against context."""
    fig = _figure(len(panels))
    for i, ((batch, mode), series) in enumerate(panels.items()):
        ax = fig.add_subplot(1, len(panels), i + 1)
        for label, points in series.items():
            xs, ys = zip(*points)
            ax.plot(xs, [y * 1e6 for y in ys], label=label, **STYLES.get(label, {}))
        _length_axis(ax, sorted({x for points in series.values() for x, _ in points}), "context (tokens)")
        ax.set_yscale("log")
        ax.set_ylabel("decode step, median (µs)")
        ax.set_title(f"B={batch}" + (f", {mode}" if mode else ""))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.savefig(path, dpi=110)


def draw_prefill(series: Series, path: Path, title: str) -> None:
    """Speedup (dense time / NSA time) against sequence length, one line per mode; 1x marked."""
    fig = _figure(1)
    ax = fig.add_subplot(1, 1, 1)
    for mode, points in series.items():
        xs, ys = zip(*points)
        ax.plot(xs, ys, marker="o", label=mode)
    ax.axhline(1.0, color="grey", linewidth=1, linestyle="--", label="dense (1x)")
    _length_axis(ax, sorted({x for points in series.values() for x, _ in points}), "sequence length (tokens)")
    ax.set_ylabel("speedup over dense (x)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.suptitle(title)
    fig.savefig(path, dpi=110)


def draw(entries: Mapping[str, Any], baseline: Mapping[str, float], folder: Path,
         device: str) -> Tuple[List[Dict[str, str]], List[str]]:
    """Draw what the data allow into ``folder``: ``([{"file", "title"}], [why a plot is missing])``."""
    decode, prefill = decode_series(entries, baseline), prefill_series(entries)
    wanted = [(DECODE_PLOT, f"Decode latency against context, {device}", decode, draw_decode),
              (PREFILL_PLOT, f"Prefill speedup of NSA over dense, {device}", prefill, draw_prefill)]
    if not any(data for _, _, data, _ in wanted):
        return [], ["no decode or prefill benchmark with NSA timings in this run"]
    try:
        import matplotlib  # noqa: F401 - only to learn whether plots can be drawn
    except ImportError:
        return [], ["matplotlib is not installed (pip install matplotlib)"]
    plots, missing = [], []
    for file, title, data, painter in wanted:
        if data:
            painter(data, folder / file, title)
            plots.append({"file": file, "title": title})
        else:
            missing.append(f"{file}: no {'decode' if file == DECODE_PLOT else 'prefill'} benchmark timed")
    return plots, missing
