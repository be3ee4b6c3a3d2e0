"""Where one kernel's warps stall, instruction by instruction: Nsight Compute's source page (SASS, with
the sampled stall reasons) summed by reason, then the instructions with the most samples.

Why: the raw counters (``scripts/ncu_stalls.py``) give a kernel's stall reasons on average, over warps
that do different work (a warp-specialised kernel's copy warp mostly waits); the source page says which
instruction each sample caught, so a loop's cost can be told from an idle warp's. Session 68 read the
Gluon window forward's this way (``docs/perf/prefill.md``)::

    ncu --profile-from-start off --clock-control none -k regex:window_fwd_gluon_kernel --set full \\
        --import-source no -o /tmp/window_fwd python scripts/ncu_prefill.py --length 8192
    ncu -i /tmp/window_fwd.ncu-rep --page source --csv --print-source sass > window_fwd.csv
    python scripts/ncu_source_stalls.py window_fwd.csv --top 30

Usage: ``python scripts/ncu_source_stalls.py FILE.csv [--top N]``. Prints markdown: each reason's samples
and share, then the top ``N`` instructions (their index in the listing, samples, executions, the
instruction and its three commonest reasons).
"""

from __future__ import annotations

import argparse
import csv
from collections import Counter
from typing import Dict, List, NamedTuple

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


class Instruction(NamedTuple):
    index: int
    source: str
    samples: int
    executed: int
    reasons: Dict[str, int]


def _count(text: str) -> int:
    text = text.replace(",", "").strip()
    return int(float(text)) if text and text not in ("-", "n/a") else 0


def instructions(path: str) -> List[Instruction]:
    """The listing's instructions in order, each with its samples, executions and samples by reason
    (the ``stall_*`` columns, not their "Not Issued" twins)."""
    with open(path) as f:
        rows = list(csv.reader(line for line in f if not line.startswith("==")))
    first = next((i for i, row in enumerate(rows) if SAMPLES in row and "Source" in row), None)
    if first is None:
        raise SystemExit(f"{path}: no header row with 'Source' and '{SAMPLES}'")
    head = rows[first]
    col = {name: i for i, name in enumerate(head)}
    reasons = [name for name in head if name.startswith("stall_") and "Not Issued" not in name]
    out = []
    for row in rows[first + 1:]:
        if len(row) < len(head):
            continue
        out.append(Instruction(len(out), row[col["Source"]].strip(), _count(row[col[SAMPLES]]),
                               _count(row[col[EXECUTED]]) if EXECUTED in col else 0,
                               {name[len("stall_"):]: _count(row[col[name]]) for name in reasons}))
    return out


def report(path: str, top: int = 30) -> str:
    """The markdown summary of :func:`instructions`."""
    listing = instructions(path)
    total = sum(i.samples for i in listing) or 1
    by_reason: Counter = Counter()
    for ins in listing:
        by_reason.update(ins.reasons)
    lines = [f"{total} samples over {len(listing)} instructions", "", "| reason | samples | share |", "|---|---|---|"]
    lines += [f"| {name} | {n} | {100 * n / total:.1f} % |" for name, n in by_reason.most_common() if n]
    lines += ["", "| # | samples | share | executed | instruction | reasons |", "|---|---|---|---|---|---|"]
    for ins in sorted(listing, key=lambda i: (-i.samples, i.index))[:top]:
        reasons = ", ".join(f"{name} {n}" for name, n in Counter(ins.reasons).most_common(3) if n)
        lines.append(f"| {ins.index} | {ins.samples} | {100 * ins.samples / total:.1f} % | {ins.executed} | "
                     f"`{ins.source}` | {reasons} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", help="ncu -i REPORT --page source --csv --print-source sass")
    parser.add_argument("--top", type=int, default=30, help="instructions listed")
    args = parser.parse_args()
    print(report(args.csv, args.top))


if __name__ == "__main__":
    main()
