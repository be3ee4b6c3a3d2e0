"""Parity margins: how close each ``nsa.testing.assert_close`` of a test came to its bound.

A passing parity test says only that every error stayed under its bound. The plugin records
each comparison a test makes (the hook in :mod:`pytest_nsa.plugin` opens
``nsa.testing.record_comparisons`` around the test's call and stores what it found in the
report's ``user_properties``, which pytest-xdist carries to the controller). This module turns
them into the report's summary and the terminal's lines.

No pytest import here.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Sequence, Tuple

if TYPE_CHECKING:
    from pytest_nsa.state import TestOutcome

#: The ``user_properties`` key a test's comparisons travel under.
PROPERTY = "nsa_comparisons"
#: ``(name, relative error, bound, dtype of the side under test)``, as recorded.
Recorded = Tuple[str, float, float, str]
#: Upper edges of the share-of-bound classes the summary counts (share = error / bound).
EDGES: Tuple[float, ...] = (0.1, 0.25, 0.5, 0.75, 1.0)
#: How many of the comparisons closest to their bound the summary lists.
CLOSEST = 15


def encode(comparisons: Iterable[Any]) -> List[Recorded]:
    """``nsa.testing.Comparison`` objects as plain tuples (what xdist can send)."""
    return [(str(c.name), float(c.error), float(c.bound), str(c.dtype)) for c in comparisons]


def from_properties(user_properties: Sequence[Tuple[str, Any]]) -> Tuple[Recorded, ...]:
    """The comparisons stored in a test report's ``user_properties`` (none: ``()``)."""
    for key, value in user_properties:
        if key == PROPERTY:
            return tuple((str(name), float(error), float(bound), str(dtype)) for name, error, bound, dtype in value)
    return ()


def share(error: float, bound: float) -> float:
    """``error / bound``; ``inf`` when the error is not finite."""
    return error / bound if math.isfinite(error) else math.inf


def _number(value: float) -> Optional[float]:
    # JSON has no infinity: a NaN or infinite error is written as null.
    return value if math.isfinite(value) else None


def as_json(comparisons: Iterable[Recorded]) -> List[Dict[str, Any]]:
    """One test's comparisons for ``results.json``: ``name``, ``error`` (null when not finite), ``bound``, ``dtype``."""
    return [{"name": name, "error": _number(error), "bound": bound, "dtype": dtype}
            for name, error, bound, dtype in comparisons]


def class_label(index: int) -> str:
    """The label of share class ``index`` of :data:`EDGES` (one more class above the last edge)."""
    if index == 0:
        return f"< {EDGES[0]:.0%}"
    if index == len(EDGES):
        return f"> {EDGES[-1]:.0%} (failed)"
    return f"{EDGES[index - 1]:.0%}-{EDGES[index]:.0%}"


def _class_of(value: float) -> int:
    return next((i for i, edge in enumerate(EDGES) if value <= edge), len(EDGES))


def summary(outcomes: Iterable["TestOutcome"], closest: int = CLOSEST) -> Dict[str, Any]:
    """The report's ``margins``: how many comparisons, in how many tests, how many fell in each
    share class, the largest share for each dtype under test (``by_dtype``: where a dtype's bound
    has room), and the ``closest`` ones to their bound (highest share first)."""
    rows = [(o.nodeid, name, error, bound, dtype, share(error, bound))
            for o in outcomes for name, error, bound, dtype in o.comparisons]
    counts = [0] * (len(EDGES) + 1)
    for *_, value in rows:
        counts[_class_of(value)] += 1
    by_dtype: Dict[str, List[float]] = {}
    for row in rows:
        by_dtype.setdefault(row[4], []).append(row[5])
    top = sorted(rows, key=lambda r: (-r[5], r[0], r[1]))[:closest]
    return {
        "comparisons": len(rows),
        "tests": len({r[0] for r in rows}),
        "classes": [{"share": class_label(i), "count": n} for i, n in enumerate(counts)],
        "by_dtype": [{"dtype": dtype, "comparisons": len(values), "largest_share": _number(max(values))}
                     for dtype, values in sorted(by_dtype.items())],
        "closest": [{"nodeid": nodeid, "name": name, "error": _number(error), "bound": bound, "dtype": dtype,
                     "share": _number(value)} for nodeid, name, error, bound, dtype, value in top],
    }


def terminal_lines(margins: Dict[str, Any], shown: int = 3) -> List[str]:
    """The terminal summary's lines (empty when no test compared anything)."""
    if not margins["comparisons"]:
        return []
    classes = ", ".join(f"{c['share']}: {c['count']}" for c in margins["classes"] if c["count"])
    lines = [f"{margins['comparisons']} comparisons in {margins['tests']} tests; share of the bound: {classes}"]
    lines.append("largest share by dtype: " + ", ".join(f"{d['dtype']} {describe_share(d['largest_share'])} "
                                                        f"({d['comparisons']})" for d in margins["by_dtype"]))
    for row in margins["closest"][:shown]:
        where = "error not finite" if row["share"] is None else f"{row['share']:.0%} of the bound"
        lines.append(f"{where}: {row['nodeid']} {row['name']} ({describe_error(row['error'])} against {row['bound']:.1e})")
    return lines


def describe_share(value: Optional[float]) -> str:
    """``0.4321`` -> ``"43%"``; ``None`` (not finite) -> ``"not finite"``."""
    return "not finite" if value is None else f"{value:.0%}"


def describe_error(value: Optional[float]) -> str:
    """``1.234e-3`` -> ``"1.23e-03"``; ``None`` -> ``"not finite"``."""
    return "not finite" if value is None else f"{value:.2e}"
