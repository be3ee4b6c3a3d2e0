"""Nsight Compute raw CSVs (``--csv --page raw``) as one markdown table a file of where each
kernel's warps stall: per kernel name, its time, instructions, warp cycles per issued instruction
and the reasons that take most of them.

Each file must hold ``gpu__time_duration.sum``, ``smsp__inst_executed.sum`` and the stall ratios
``smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio`` (warps stalled for that reason
per cycle with an issue: summed over the reasons, the warp cycles per issued instruction). These
are plain counters, not the sampled stall reasons of the source page. ``scripts/gpu_session58.sh
stalls`` collects them into a report and reads it back as CSV::

    ncu --profile-from-start off --clock-control none -o /tmp/step \\
        --metrics 'regex:^(gpu__time_duration\\.sum|smsp__inst_executed\\.sum|smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio)$' \\
        python scripts/ncu_decode.py --cases 16:65536
    ncu -i /tmp/step.ncu-rep --csv --page raw > step.csv

Launches of one kernel name are added up, their ratios weighted by their instructions.

Usage: ``python scripts/ncu_stalls.py FILE.csv [FILE.csv ...] [--top N]``.
"""

from __future__ import annotations

import argparse
import csv
import re
from typing import Dict, List

TIME, INST = "gpu__time_duration.sum", "smsp__inst_executed.sum"
STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")
SCALE = {"ns": 1e-9, "us": 1e-6, "usecond": 1e-6, "msecond": 1e-3, "ms": 1e-3, "s": 1.0, "nsecond": 1e-9,
         "inst": 1.0, "": 1.0}


def kernels(path: str) -> Dict[str, Dict[str, float]]:
    """Per kernel name: ``s`` seconds, ``inst`` instructions, ``n`` launches and, per stall
    reason, its ratio weighted by instructions (``stall:<reason>``, divided out at the end)."""
    with open(path) as f:
        rows = list(csv.reader(line for line in f if not line.startswith("==")))
    # the header row names the kernels; anything printed before it is not the table's
    first = next((i for i, row in enumerate(rows) if "Kernel Name" in row), None)
    if first is None:
        raise SystemExit(f"{path}: no header row with 'Kernel Name'")
    rows = rows[first:]
    head, units = rows[0], rows[1]
    col = {name: i for i, name in enumerate(head)}
    stalls = {STALL.match(name).group(1): i for name, i in col.items() if STALL.match(name)}
    if not stalls or TIME not in col or INST not in col:
        raise SystemExit(f"{path}: needs {TIME}, {INST} and the stall ratios")

    def value(row: List[str], i: int) -> float:
        try:
            return float(row[i].replace(",", "")) * SCALE.get(units[i], 1.0)
        except ValueError:  # "n/a" where a counter does not apply
            return 0.0

    out: Dict[str, Dict[str, float]] = {}
    for row in rows[2:]:
        name = row[col["Kernel Name"]].split("(")[0][:60]
        k = out.setdefault(name, {"s": 0.0, "inst": 0.0, "n": 0.0})
        inst = value(row, col[INST])
        k["s"] += value(row, col[TIME])
        k["inst"] += inst
        k["n"] += 1
        for reason, i in stalls.items():
            k[f"stall:{reason}"] = k.get(f"stall:{reason}", 0.0) + value(row, i) * inst
    for k in out.values():
        for key in [key for key in k if key.startswith("stall:")]:
            k[key] /= max(k["inst"], 1.0)
    return out


def table(path: str, top: int = 5) -> str:
    """The markdown table of one file: kernels by time, each with its ``top`` stall reasons."""
    lines = [f"`{path.rsplit('/', 1)[-1]}`", "",
             "| kernel | launches | ms | instructions (M) | warp cycles per issued instruction | most of them (cycles, share) |",
             "|---|---:|---:|---:|---:|---|"]
    for name, k in sorted(kernels(path).items(), key=lambda kv: -kv[1]["s"]):
        reasons = sorted(((key[6:], v) for key, v in k.items() if key.startswith("stall:")), key=lambda rv: -rv[1])
        cpi = sum(v for _, v in reasons)
        shown = ", ".join(f"{reason} {v:.2f} ({100 * v / cpi:.0f} %)" for reason, v in reasons[:top] if cpi > 0)
        lines.append(f"| {name} | {k['n']:.0f} | {1e3 * k['s']:.3f} | {k['inst'] / 1e6:.1f} | {cpi:.2f} | {shown} |")
    return "\n".join(lines + [""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--top", type=int, default=5, help="stall reasons shown a kernel")
    args = parser.parse_args()
    print("\n".join(table(path, args.top) for path in args.files))


if __name__ == "__main__":
    main()
