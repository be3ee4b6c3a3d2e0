"""Benchmark baselines: one JSON file per GPU profile, and the comparison against one.

File: ``gpu_profiles/baselines/<profile>/benchmarks.json``::

    {"schema": 1, "profile": "h200", "created": "2026-11-22T01:00:00+00:00",
     "machine": {"profile": "h200", "device": "NVIDIA H200", "capability": "9.0", "cpu_count": null,
                 "driver": "580.159.04", "cuda": "13.0", "torch": "2.11.0+cu130",
                 "triton": "3.6.0", "python": "3.12"},
     "benchmarks": {"<test node id>": {"median": 1.2e-05, "iqr": 3e-07, "q1": ..., "q3": ...,
                    "mean": ..., "min": ..., "max": ..., "stddev": ..., "rounds": 50,
                    "info": {<the benchmark's extra_info: kind, impl, mode, shape, routes, ...>}}}}

Times are seconds. A baseline is only compared with a run on the same machine
and software: every field of :data:`IDENTITY` must match, or the comparison is
refused naming the fields that differ. A benchmark regresses when its median
exceeds the baseline median by more than ``max(threshold * baseline median,
SPREAD_FACTOR * spread)``, the spread being the larger IQR of the two runs;
improvements never fail. A host-bound benchmark (``info["host_share"]`` of
either run at least :data:`HOST_BOUND_SHARE`: the host's launches take at least
half its time) is judged with the profile's wider host-bound threshold: its
time follows the host machine as much as the code. No pytest or torch import
here.
"""

from __future__ import annotations

import json
import math
import os
import platform
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

SCHEMA_VERSION = 1
FILE_NAME = "benchmarks.json"
#: Machine fields that must be equal for a comparison, in the order they are reported.
IDENTITY: Tuple[str, ...] = (
    "profile", "device", "capability", "cpu_count", "driver", "cuda", "torch", "triton", "python",
)
#: A change smaller than this many spreads (IQRs) is noise, whatever the threshold says.
SPREAD_FACTOR = 1.5
STATS: Tuple[str, ...] = ("median", "iqr", "q1", "q3", "mean", "min", "max", "stddev")
#: A benchmark whose host submission takes at least this share of its time is host-bound. The
#: H200's eager decode steps (each starts on an idle device and pays its launches) moved 0.65-1.96x
#: between the baselines of sessions 50 and 66 with the same decode code, its graph replays
#: 0.99-1.01x.
HOST_BOUND_SHARE = 0.5

REGRESSION, IMPROVED, OK, NEW, CHANGED = "REGRESSION", "improved", "ok", "new", "shape changed"


class BaselineError(ValueError):
    """A baseline file cannot be read; the message names the file and the problem."""


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), else what :mod:`platform` says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass  # not Linux: platform's answer below
    return platform.processor() or platform.machine() or "unknown CPU"


def machine_fields(profile: str, hardware: Any, software: Any) -> Dict[str, Any]:
    """The :data:`IDENTITY` fields of this run.

    Args:
        profile: the active GPU profile's name.
        hardware: a :class:`pytest_nsa.hardware.HardwareInfo` (``primary``, ``driver``, ``cuda``).
        software: a :class:`pytest_nsa.versions.SoftwareInfo` (``torch``, ``triton``, ``python``).

    A GPU run is identified by the GPU; a CPU run by the CPU model and core count.
    """
    gpu = hardware.primary
    python = ".".join(str(software.python).split(".")[:2])
    return {
        "profile": profile,
        "device": gpu.name if gpu is not None else f"CPU {cpu_model()}",
        "capability": gpu.sm if gpu is not None else None,
        "cpu_count": None if gpu is not None else os.cpu_count(),
        "driver": hardware.driver,
        "cuda": hardware.cuda,
        "torch": software.torch,
        "triton": software.triton,
        "python": python,
    }


def differences(stored: Mapping[str, Any], now: Mapping[str, Any]) -> List[str]:
    """``"field (X in the baseline, Y here)"`` for every :data:`IDENTITY` field that differs."""
    return [f"{key} ({stored.get(key)!r} in the baseline, {now.get(key)!r} here)"
            for key in IDENTITY if stored.get(key) != now.get(key)]  # fmt: skip


@dataclass(frozen=True)
class Entry:
    """One benchmark's statistics (seconds) and its ``extra_info`` (``info``)."""

    median: float
    iqr: float
    q1: float
    q3: float
    mean: float
    min: float
    max: float
    stddev: float
    rounds: int
    info: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_stats(cls, stats: Mapping[str, Any], info: Optional[Mapping[str, Any]] = None) -> "Entry":
        """From a mapping with :data:`STATS` and ``rounds`` (pytest-benchmark's flat stats, or
        :meth:`nsa.bench.timing.Samples.summary`)."""
        return cls(**{k: float(stats[k]) for k in STATS}, rounds=int(stats["rounds"]), info=dict(info or {}))

    def to_json(self) -> Dict[str, Any]:
        return {**{k: getattr(self, k) for k in STATS}, "rounds": self.rounds, "info": dict(self.info)}


@dataclass(frozen=True)
class Baseline:
    """A stored baseline: who measured it (``machine``) and what (``entries`` by benchmark name)."""

    profile: str
    machine: Mapping[str, Any]
    entries: Mapping[str, Entry]
    created: str = ""

    def to_json(self) -> Dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION, "profile": self.profile, "created": self.created,
            "machine": dict(self.machine),
            "benchmarks": {name: self.entries[name].to_json() for name in sorted(self.entries)},
        }  # fmt: skip


def path_for(root: Path, profile: str) -> Path:
    """Where the baseline of ``profile`` lives under ``root`` (``gpu_profiles/baselines``)."""
    return Path(root) / profile / FILE_NAME


def _entry(name: str, raw: Any, where: str) -> Entry:
    if not isinstance(raw, dict):
        raise BaselineError(f"{where}: benchmarks[{name!r}] must be a mapping")
    def numeric(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    missing = [k for k in (*STATS, "rounds") if not numeric(raw.get(k))]
    if missing:
        raise BaselineError(f"{where}: benchmarks[{name!r}] lacks numeric {', '.join(missing)}")
    if not all(math.isfinite(float(raw[k])) and float(raw[k]) >= 0 for k in STATS):
        raise BaselineError(f"{where}: benchmarks[{name!r}] has a negative or non-finite statistic")
    return Entry.from_stats(raw, raw.get("info") if isinstance(raw.get("info"), dict) else {})


def load(path: Path) -> Baseline:
    """Read and check a baseline file.

    Raises:
        FileNotFoundError: there is none (callers report this, it is no error).
        BaselineError: unreadable JSON, another schema version, or malformed fields.
    """
    where = str(path)
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise BaselineError(f"{where}: not valid JSON ({err})") from None
    if not isinstance(raw, dict):
        raise BaselineError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    if raw.get("schema") != SCHEMA_VERSION:
        raise BaselineError(f"{where}: schema {raw.get('schema')!r} is not the one this nsa reads ({SCHEMA_VERSION})")
    machine, benchmarks = raw.get("machine"), raw.get("benchmarks")
    if not isinstance(machine, dict) or not isinstance(benchmarks, dict) or not isinstance(raw.get("profile"), str):
        raise BaselineError(f"{where}: needs 'profile' (text), 'machine' and 'benchmarks' (mappings)")
    entries = {name: _entry(name, value, where) for name, value in benchmarks.items()}
    return Baseline(raw["profile"], machine, entries, str(raw.get("created", "")))


def save(baseline: Baseline, path: Path) -> None:
    """Write ``baseline`` to ``path`` (folders created), stable key order for readable diffs."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(baseline.to_json(), indent=1, sort_keys=True) + "\n", encoding="utf-8")


def updated(old: Optional[Baseline], profile: str, machine: Mapping[str, Any],
            entries: Mapping[str, Entry]) -> Tuple[Baseline, str]:  # fmt: skip
    """The baseline to write after a run: ``old`` with ``entries`` updated when it was recorded
    on the same machine, else ``entries`` alone. Returns it with a note saying which."""
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    if old is not None and not differences(old.machine, machine):
        merged = {**old.entries, **entries}
        kept = len(merged) - len(entries)
        note = f"updated {len(entries)}, kept {kept} from the earlier run"
        return Baseline(profile, dict(machine), merged, now), note
    if old is not None:
        why = "; ".join(differences(old.machine, machine))
        return Baseline(profile, dict(machine), dict(entries), now), f"replaced a baseline from another machine: {why}"
    return Baseline(profile, dict(machine), dict(entries), now), f"new baseline with {len(entries)} benchmarks"


@dataclass(frozen=True)
class Row:
    """One line of the comparison table; times in seconds, ``change`` a fraction."""

    name: str
    verdict: str
    now: float
    baseline: Optional[float] = None
    change: Optional[float] = None
    limit: Optional[float] = None
    host_bound: bool = False


def _shape(entry: Entry) -> Any:
    return entry.info.get("shape")


def host_bound(*entries: Entry) -> bool:
    """Whether any of ``entries`` recorded a host share (``info["host_share"]``) of at least
    :data:`HOST_BOUND_SHARE`."""
    return any((entry.info.get("host_share") or 0.0) >= HOST_BOUND_SHARE for entry in entries)


def compare(baseline: Baseline, entries: Mapping[str, Entry], threshold_pct: float,
            host_bound_threshold_pct: Optional[float] = None) -> List[Row]:
    """Judge every benchmark of this run (``entries``) against ``baseline``: a median beyond
    ``baseline + max(threshold, SPREAD_FACTOR * max(IQR then, IQR now))`` is a regression,
    below ``baseline - margin`` an improvement; the threshold is ``host_bound_threshold_pct`` (where
    given) for a :func:`host_bound` benchmark. New names and changed shapes are listed, not judged."""
    rows: List[Row] = []
    for name in sorted(entries):
        now = entries[name]
        base = baseline.entries.get(name)
        if base is None:
            rows.append(Row(name, NEW, now.median))
            continue
        change = now.median / base.median - 1 if base.median > 0 else None
        if _shape(base) != _shape(now):
            rows.append(Row(name, CHANGED, now.median, base.median, change))
            continue
        on_host = host_bound_threshold_pct is not None and host_bound(base, now)
        pct = host_bound_threshold_pct if on_host else threshold_pct
        margin = max(pct / 100 * base.median, SPREAD_FACTOR * max(base.iqr, now.iqr))
        verdict = OK
        if now.median > base.median + margin:
            verdict = REGRESSION
        elif now.median < base.median - margin:
            verdict = IMPROVED
        rows.append(Row(name, verdict, now.median, base.median, change, base.median + margin, on_host))
    return rows


def format_seconds(seconds: Optional[float]) -> str:
    """``"12.3 us"``, ``"4.56 ms"``, ``"1.20 s"`` (``"-"`` for ``None``)."""
    if seconds is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def table(rows: Sequence[Row]) -> List[str]:
    """The comparison as aligned text lines: benchmark, baseline, now, change, verdict."""
    header = ("benchmark", "baseline", "now", "change", "verdict")
    body = []
    for row in rows:
        change = "-" if row.change is None else f"{row.change * 100:+.1f}%"
        verdict = row.verdict + (f" (limit {format_seconds(row.limit)})" if row.verdict == REGRESSION else "")
        verdict += ", host-bound" if row.host_bound else ""
        body.append((row.name, format_seconds(row.baseline), format_seconds(row.now), change, verdict))
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    fmt = "{:<%d}  {:>%d}  {:>%d}  {:>%d}  {}" % tuple(widths[:4])
    return [fmt.format(*header), *(fmt.format(*r) for r in body)]
