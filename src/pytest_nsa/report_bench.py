"""The benchmark section of the report: decode and prefill tables against the stored baseline, and plots.

No pytest import here. Reads what :mod:`pytest_nsa.benchmarks` decided at
session end (its ``BenchState``: the timed benchmarks of this run, the
comparison rows of :func:`nsa.bench.baselines.compare`, its summary lines) and
the pytest-benchmark JSON of the run, and returns the ``benchmarks`` section of
``results.json`` (schema in ``schemas/results.schema.json``).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from nsa.bench import baselines
from pytest_nsa import report_plots

#: The pytest-benchmark JSON of the run, inside the report folder.
JSON_FILE = "benchmarks.json"
TABLES = ("decode", "prefill", "other")
NOT_COMPARED = "not compared"


def _params(info: Mapping[str, Any]) -> Dict[str, Any]:
    shape = info.get("shape") if isinstance(info.get("shape"), Mapping) else {}
    keep = {k: info[k] for k in ("kind", "impl", "mode", "nsa_over_dense", "host_share") if info.get(k) is not None}
    return {**keep, **shape}


def _rows(bench: Any) -> List[Dict[str, Any]]:
    """One row per timed benchmark: the comparison where one was made, else the measurement alone."""
    measured: Mapping[str, Any] = bench.measured
    if bench.rows:
        rows = [{"name": r.name, "params": _params(measured[r.name].info if r.name in measured else {}),
                 "baseline": r.baseline, "now": r.now, "change_pct": None if r.change is None else r.change * 100,
                 "verdict": r.verdict} for r in bench.rows]
    else:
        verdict = "saved as baseline" if bench.mode == "save" and bench.path is not None else NOT_COMPARED
        rows = [{"name": name, "params": _params(e.info), "baseline": None, "now": e.median, "change_pct": None,
                 "verdict": verdict} for name, e in measured.items()]
    return sorted(rows, key=_order)


def _order(row: Mapping[str, Any]) -> tuple:
    # Numeric order of the points (names sort S1024 before S512), then the name.
    p = row["params"]
    return (str(p.get("impl", "")), str(p.get("mode", "")), p.get("batch", 0), p.get("length", 0), row["name"])


def _note(bench: Any, outcomes: Sequence[Any], count: int) -> str:
    tests = [o for o in outcomes if "benchmark" in o.markers]
    if bench is None:
        return "No benchmark data: pytest_nsa's benchmark plugin is not active in this run."
    if bench.measured:
        text = f"{len(bench.measured)} benchmarks timed and passed ({count} in pytest-benchmark's JSON). "
        if bench.rows:
            verdicts = Counter(r.verdict for r in bench.rows)
            summary = ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items()))
            return text + f"Compared with the stored baseline `{bench.path}`: {summary}."
        return text + " ".join(bench.lines) if bench.lines else text + "Not compared with a baseline."
    if not tests:
        return ("No benchmark test ran in this session (the suites are in tests/benchmarks and run with "
                "--nsa-bench).")
    skipped = Counter(o.skip_reason for o in tests if o.outcome == "skipped")
    if skipped and len(skipped) == 1 and sum(skipped.values()) == len(tests):
        return f"No benchmark data: all {len(tests)} benchmark tests skipped ({next(iter(skipped))})."
    detail = " ".join(bench.lines) or "none was timed and passed"
    return f"No benchmark data from the {len(tests)} benchmark tests: {detail}"


def section(output_json: Optional[Mapping[str, Any]], bench: Any, outcomes: Sequence[Any], folder: Path,
            device: str) -> Dict[str, Any]:
    """The ``benchmarks`` section, drawing the plots into ``folder``.

    Args:
        output_json: pytest-benchmark's JSON of the run (``None`` when it produced none).
        bench: :class:`pytest_nsa.benchmarks.BenchState` after its session end, or ``None``.
        outcomes: the run's :class:`pytest_nsa.state.TestOutcome` list (benchmark tests' skips).
        device: for the plot titles, e.g. ``"NVIDIA H200"``.
    """
    count = len(output_json.get("benchmarks", [])) if output_json else 0
    rows = _rows(bench) if bench is not None else []
    tables: Dict[str, List[Dict[str, Any]]] = {name: [] for name in TABLES}
    for row in rows:
        kind = row["params"].get("kind")
        tables[kind if kind in TABLES else "other"].append(row)
    measured = bench.measured if bench is not None else {}
    if measured:
        # Rows exist only when the baseline was read and accepted for this machine moments ago.
        stored = baselines.load(bench.path).entries if bench.rows else None
        plots, missing = report_plots.draw(measured, stored, folder, device)
    else:
        plots, missing = [], ["no benchmark was timed"]
    return {
        "status": "measured" if measured else "none",
        "note": _note(bench, outcomes, count),
        "count": count,
        "json_file": JSON_FILE if output_json is not None else None,
        "unit": "s",
        "baseline": str(bench.path) if bench is not None and bench.rows else None,
        "tables": tables,
        "plots": plots,
        "plots_missing": missing,
    }
