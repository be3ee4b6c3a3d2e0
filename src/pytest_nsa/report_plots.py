"""The report's PNG plots, drawn by ``nsa-bench``'s own plotting (:mod:`nsa.bench.plot`).

No pytest import here. This module only reshapes the timed benchmarks of the
pytest run into the rows those functions draw: entries are ``{name: entry}`` with
``entry.median`` (seconds) and ``entry.info`` (the benchmark's ``extra_info``:
``kind``, ``impl``, ``mode``, ``shape`` with ``batch`` and ``length``, and for NSA
points ``nsa_over_dense``, the ratio of medians with dense measured beside it in
the same run; see ``tests/benchmarks/_records.py``). The stored baseline's entries
go through the same reshaping and are drawn beside the run's.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

DECODE_PLOT = "decode_latency_{mode}.png"
PREFILL_PLOT = "prefill_speedup.png"
NAN = float("nan")

Rows = List[Dict[str, Any]]


def _points(entries: Mapping[str, Any], kind: str) -> List[Tuple[str, str, int, int, Any]]:
    """``(impl, mode, batch, length, entry)`` of the ``kind`` benchmarks whose info says so."""
    out = []
    for entry in entries.values():
        info, shape = entry.info, entry.info.get("shape")
        if info.get("kind") != kind or not isinstance(shape, Mapping) or not {"batch", "length"} <= set(shape):
            continue
        out.append((str(info.get("impl")), str(info.get("mode", "")), int(shape["batch"]), int(shape["length"]), entry))
    return out


def decode_rows(entries: Mapping[str, Any]) -> Dict[str, Rows]:
    """Per decode mode (``eager``, ``graph``), the rows of :func:`nsa.bench.plot.decode_plot`:
    ``batch``, ``context``, ``nsa_ms``, ``dense_ms`` (NaN where one side was not timed)."""
    table: Dict[str, Dict[Tuple[int, int], Dict[str, Any]]] = {}
    for impl, mode, batch, context, entry in _points(entries, "decode"):
        if impl in ("nsa", "dense"):
            row = table.setdefault(mode, {}).setdefault(
                (batch, context), {"batch": batch, "context": context, "nsa_ms": NAN, "dense_ms": NAN, "status": "ok"})
            row[f"{impl}_ms"] = entry.median * 1e3
    return {mode: [rows[k] for k in sorted(rows)] for mode, rows in sorted(table.items())}


def prefill_rows(entries: Mapping[str, Any]) -> Rows:
    """The rows of :func:`nsa.bench.plot.prefill_plot`: ``length``, ``fwd_speedup``,
    ``fwdbwd_speedup`` (dense over NSA, from the NSA points' ``nsa_over_dense``)."""
    column = {"fwd": "fwd_speedup", "fwd+bwd": "fwdbwd_speedup"}
    rows: Dict[int, Dict[str, Any]] = {}
    for impl, mode, _, length, entry in _points(entries, "prefill"):
        ratio = entry.info.get("nsa_over_dense")
        if impl == "nsa" and mode in column and ratio:
            row = rows.setdefault(length, {"length": length, "fwd_speedup": NAN, "fwdbwd_speedup": NAN, "status": "ok"})
            row[column[mode]] = 1.0 / float(ratio)
    return [rows[k] for k in sorted(rows)]


def decode_series(rows: Rows) -> Dict[str, Dict[int, float]]:
    """Decode rows as baseline series (``"NSA B=1": {context: ms}``, ``"dense B=1"``...)."""
    series: Dict[str, Dict[int, float]] = {}
    for row in rows:
        for label, key in (("NSA", "nsa_ms"), ("dense", "dense_ms")):
            if row[key] == row[key]:  # not NaN
                series.setdefault(f"{label} B={row['batch']}", {})[row["context"]] = row[key]
    return series


def prefill_series(rows: Rows) -> Dict[str, Dict[int, float]]:
    """Prefill rows as baseline series (``"fwd": {length: speedup}``, ``"fwd+bwd"``)."""
    series: Dict[str, Dict[int, float]] = {}
    for row in rows:
        for label, key in (("fwd", "fwd_speedup"), ("fwd+bwd", "fwdbwd_speedup")):
            if row[key] == row[key]:
                series.setdefault(label, {})[row["length"]] = row[key]
    return series


def draw(entries: Mapping[str, Any], baseline: Optional[Mapping[str, Any]], folder: Path,
         device: str) -> Tuple[List[Dict[str, str]], List[str]]:
    """Draw what the data allow into ``folder``: one decode plot per mode, one prefill plot.

    Args:
        baseline: the stored baseline's entries (same form as ``entries``), or ``None``.

    Returns:
        ``([{"file", "title"}], [why a plot is missing])``.
    """
    decode, prefill = decode_rows(entries), prefill_rows(entries)
    if not decode and not prefill:
        return [], ["no decode or prefill benchmark timed in this run"]
    if importlib.util.find_spec("matplotlib") is None:
        return [], ["plots need matplotlib, which is not installed (pip install matplotlib)"]
    from nsa.bench import plot
    stored_decode = decode_rows(baseline or {})
    plots, missing = [], []
    for mode, rows in decode.items():
        file, title = DECODE_PLOT.format(mode=mode), f"NSA decode ({mode}) against dense, {device}"
        plot.decode_plot(rows, decode_series(stored_decode.get(mode, [])), folder / file, title)
        plots.append({"file": file, "title": title})
    if prefill:
        title = f"NSA prefill speedup over dense, {device}"
        plot.prefill_plot(prefill, prefill_series(prefill_rows(baseline or {})), folder / PREFILL_PLOT, title)
        plots.append({"file": PREFILL_PLOT, "title": title})
    missing += [] if decode else ["decode plot: no decode benchmark timed"]
    missing += [] if prefill else ["prefill plot: no NSA prefill benchmark timed"]
    return plots, missing
