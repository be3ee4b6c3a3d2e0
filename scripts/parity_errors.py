"""The largest relative error under each bound, from the `results.json` of validation reports.

    python scripts/parity_errors.py docs/reports/<run>/ [more runs...]

Each `nsa.testing.assert_close` of a run is one comparison (dtype under test, bound, error). The
table groups them by dtype and bound over all the runs given, and names the comparison closest to
its bound in each group: what `docs/tolerances.md` reads when it sets the profiles' tolerances.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def comparisons(run: Path):
    """``(dtype, bound, error, test, compared)`` of every comparison in one report folder."""
    results = json.loads((run / "results.json").read_text())
    for test in results["tests"]:
        for c in test.get("comparisons") or ():
            yield c["dtype"], c["bound"], c["error"], test["nodeid"], c["name"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="report folders (each holds a results.json)")
    args = parser.parse_args()
    groups = defaultdict(list)
    for run in args.runs:
        for dtype, bound, error, test, compared in comparisons(run):
            groups[(dtype, bound)].append((error, test, compared))
    print("| dtype | bound | comparisons | largest error | share of the bound | where |")
    print("|---|---:|---:|---:|---:|---|")
    for (dtype, bound), rows in sorted(groups.items(), key=lambda item: (item[0][0], -item[0][1])):
        error, test, compared = max(rows)
        print(f"| {dtype} | {bound:.0e} | {len(rows)} | {error:.2e} | {error / bound:.0%} | `{test}` ({compared}) |")


if __name__ == "__main__":
    main()
