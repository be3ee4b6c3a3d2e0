"""Nsight Compute raw CSVs (``--csv --page raw``) as one markdown table of time and bytes per kernel.

Each file must hold these metrics (``scripts/gpu_session23.sh l2bytes`` collects them):
``gpu__time_duration.sum``, ``lts__t_bytes.sum`` (bytes through L2), ``dram__bytes_read.sum``,
``dram__bytes_write.sum``, ``lts__throughput.avg.pct_of_peak_sustained_elapsed`` and
``sm__throughput.avg.pct_of_peak_sustained_elapsed``; ``lts__t_sector_hit_rate.pct`` is optional
(``scripts/gpu_session73.sh l2`` adds it) and gives an L2 hit-rate column. Launches of one kernel
name are summed (their throughputs time-weighted, their hit rates weighted by L2 bytes). Under the
table: the file's totals, the best L2 rate that any of its kernels implies at 100 % (its L2 bytes a
second over its share of peak; that share is the busiest L2 sub-unit's, so the rate a byte costs
depends on the access pattern), and what all the file's L2 bytes would take at that rate: a floor
for any schedule of these kernels, overlapped or not, as long as they move the same bytes.

Usage: ``python scripts/ncu_bytes.py FILE.csv [FILE.csv ...]``.
"""

from __future__ import annotations

import csv
import sys
from typing import Dict, List

TIME, L2, DRAM_R, DRAM_W = "gpu__time_duration.sum", "lts__t_bytes.sum", "dram__bytes_read.sum", "dram__bytes_write.sum"
L2_PCT, SM_PCT = "lts__throughput.avg.pct_of_peak_sustained_elapsed", "sm__throughput.avg.pct_of_peak_sustained_elapsed"
HIT = "lts__t_sector_hit_rate.pct"
SCALE = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "%": 1.0}


def kernels(path: str) -> Dict[str, Dict[str, float]]:
    """Per kernel name: seconds, bytes (L2, DRAM read, DRAM write), launches, the time-weighted
    L2 and SM throughput (% of peak) and, where the file has it, the L2 hit rate (% of sectors)
    weighted by L2 bytes (``hit_l2``: the sum of rate x bytes; None without the column)."""
    with open(path) as f:
        rows = list(csv.reader(line for line in f if not line.startswith("==")))
    head, units = rows[0], rows[1]
    col = {name: head.index(name) for name in (TIME, L2, DRAM_R, DRAM_W, L2_PCT, SM_PCT, "Kernel Name")}
    if HIT in head:
        col[HIT] = head.index(HIT)

    def value(row: List[str], name: str) -> float:
        return float(row[col[name]].replace(",", "")) * SCALE[units[col[name]]]

    out: Dict[str, Dict[str, float]] = {}
    for row in rows[2:]:
        name = row[col["Kernel Name"]].split("(")[0][:60]
        k = out.setdefault(name, dict(dict.fromkeys(("s", "l2", "dr", "dw", "n", "l2_pct_s", "sm_pct_s"), 0.0),
                                      hit_l2=0.0 if HIT in col else None))
        s = value(row, TIME)
        k["s"] += s
        k["l2"] += value(row, L2)
        k["dr"] += value(row, DRAM_R)
        k["dw"] += value(row, DRAM_W)
        k["n"] += 1
        k["l2_pct_s"] += value(row, L2_PCT) * s
        k["sm_pct_s"] += value(row, SM_PCT) * s
        if HIT in col:
            k["hit_l2"] += value(row, HIT) * value(row, L2)
    return out


def _hit_rate(k: Dict[str, float]) -> str:
    """A kernel's L2 hit rate, weighted by its launches' L2 bytes ("" without bytes)."""
    return f"{k['hit_l2'] / k['l2']:.1f}" if k["l2"] else ""


def table(path: str) -> str:
    ks = kernels(path)
    hits = any(k["hit_l2"] is not None for k in ks.values())
    lines = [f"`{path.rsplit('/', 1)[-1]}`", "",
             "| kernel | launches | ms | L2 GB | DRAM read / write GB | L2 % of peak | SM % of peak | L2 TB/s |"
             + (" L2 hit % |" if hits else ""),
             "|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if hits else "")]
    peak = 0.0
    for name, k in sorted(ks.items(), key=lambda kv: -kv[1]["s"]):
        l2_pct = k["l2_pct_s"] / k["s"]
        rate = k["l2"] / k["s"]
        if l2_pct > 0:
            peak = max(peak, rate / (l2_pct / 100))
        lines.append(f"| {name} | {k['n']:.0f} | {1e3 * k['s']:.3f} | {k['l2'] / 1e9:.2f} | "
                     f"{k['dr'] / 1e9:.2f} / {k['dw'] / 1e9:.2f} | {l2_pct:.1f} | {k['sm_pct_s'] / k['s']:.1f} | "
                     f"{rate / 1e12:.2f} |" + (f" {_hit_rate(k)} |" if hits else ""))
    total = {key: sum(k[key] for k in ks.values()) for key in ("s", "l2", "dr", "dw")}
    lines += ["", f"All: {1e3 * total['s']:.3f} ms, {total['l2'] / 1e9:.2f} GB through L2, DRAM "
              f"{total['dr'] / 1e9:.2f} GB read / {total['dw'] / 1e9:.2f} GB written. Best L2 rate a kernel "
              f"implies at 100 %: {peak / 1e12:.2f} TB/s; all these L2 bytes at that rate: "
              f"{1e3 * total['l2'] / peak:.3f} ms.", ""]
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    print("\n".join(table(path) for path in sys.argv[1:]))


if __name__ == "__main__":
    main()
