"""The facts of a validation report as plain JSON-ready dicts: ``env.json`` and ``results.json``.

No pytest import here. :func:`env_document` turns the plugin's decisions
(hardware, software, pairing verdicts, profile, applied flags, routing) into
the ``env.json`` document; :func:`results_document` turns the session's test
outcomes, failures and benchmark summary into ``results.json``. Both follow the
schemas in ``pytest_nsa/schemas/`` (see :mod:`pytest_nsa.report_schema`).
"""

from __future__ import annotations

import platform
import re
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from pytest_nsa import gpu_memory, margins
from pytest_nsa.markers import MARKERS
from pytest_nsa.report_schema import SCHEMA_VERSION

if TYPE_CHECKING:
    from pytest_nsa.hardware import HardwareInfo
    from pytest_nsa.state import NSAState, TestOutcome

#: Outcome names of :class:`pytest_nsa.state.TestOutcome`, in report column order.
OUTCOMES: Tuple[str, ...] = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
#: Rows of the marker matrix: every pytest_nsa marker, then tests with none of them.
MATRIX_ROWS: Tuple[str, ...] = (*MARKERS, "(no nsa marker)")
NO_GIT = "nogit"


@dataclass(frozen=True)
class Failure:
    """One failed phase of a test (or a collector that failed to collect).

    Attributes:
        nodeid: the test (or collector) id.
        outcome: ``failed`` (the call failed) or ``error`` (setup, teardown or collection).
        when: ``setup``, ``call``, ``teardown`` or ``collect``.
        message: the first line of the error, e.g. ``"AssertionError: assert 1 == 2"``.
    """

    nodeid: str
    outcome: str
    when: str
    message: str


@dataclass
class RunInfo:
    """How the session went.

    Attributes:
        started, finished: timezone-aware times of ``pytest_configure`` and session end.
        exit_status: pytest's exit code (0 passed, 1 failures, 2 interrupted, ...).
        partial_reasons: why the run did not run every collected test (empty: complete).
        args: the command line arguments.
        collected: tests collected (after deselection).
        workers: xdist workers (0 without xdist).
        unfinished: tests that started but did not end (interrupted mid-test).
        worker_notes: ``{worker id: note}`` that each xdist worker sent back: its device and CPU
            threads, and where workers share a GPU, how many tests ran alone and how long it waited
            for turns (as the terminal's worker lines print them).
    """

    started: datetime
    finished: datetime
    exit_status: int
    args: Sequence[str] = ()
    collected: int = 0
    workers: int = 0
    partial_reasons: List[str] = field(default_factory=list)
    unfinished: List[str] = field(default_factory=list)
    worker_notes: Dict[str, str] = field(default_factory=dict)


def slug(text: str) -> str:
    """``"NVIDIA GeForce RTX 4090"`` -> ``"nvidia-geforce-rtx-4090"`` (lowercase, ``[a-z0-9-]``)."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def device_slug(hw: Optional["HardwareInfo"]) -> str:
    """The device part of the report folder's name: the first GPU's name (``-xN`` for N
    GPUs), or ``cpu`` without one."""
    if hw is None or hw.primary is None:
        return "cpu"
    return slug(hw.primary.name) + (f"-x{hw.gpu_count}" if hw.gpu_count > 1 else "")


def git_commit(root: Path) -> Tuple[str, Optional[bool]]:
    """``(short commit, dirty)`` of the checkout at ``root``; ``("nogit", None)`` outside
    one or without git. ``dirty`` says whether tracked files differ from the commit."""
    def git(*args: str) -> Optional[str]:
        try:
            done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=20, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    short = git("rev-parse", "--short", "HEAD")
    if not short:
        return NO_GIT, None
    status = git("status", "--porcelain", "--untracked-files=no")
    return short, None if status is None else bool(status)


def routing_rows(device: str, dtype_name: str) -> List[Dict[str, str]]:
    """The backend :func:`nsa.routing.resolve` picks for every op on ``device`` with
    ``dtype_name`` (e.g. ``"bfloat16"``); an op that cannot route shows ``ERROR``."""
    import torch  # deferred: torch costs seconds to import

    from nsa import flags, routing

    rows = []
    for op in flags.OPS:
        try:
            route = routing.resolve(op, device, getattr(torch, dtype_name))
            rows.append({"op": op, "backend": route.backend, "reason": route.reason})
        except (routing.BackendUnavailableError, flags.FlagError) as err:
            rows.append({"op": op, "backend": "ERROR", "reason": str(err)})
    return rows


def flags_in_effect() -> Dict[str, str]:
    """Every declared ``NSA_`` flag set in the environment now (by the user or by the profile),
    as the environment spells it: what a rerun must set to reproduce the run."""
    from nsa import flags

    return {name: flags.FLAGS[name].format(value) for name, (value, source) in flags.current().items()
            if source == "environment"}


def float32_products(device: str) -> Dict[str, Optional[str]]:
    """How float32 inputs multiply on ``device`` (heads up to 128 wide): torch's float32 matmul
    precision and the ``tl.dot`` precision the Triton kernels take from it and ``NSA_FLOAT32_DOT``
    (:func:`nsa.ops._triton.attention.dot_precision`); ``products`` None where that cannot be
    told (no Triton, a bad flag value), with ``error`` saying why."""
    import torch

    out: Dict[str, Optional[str]] = {"torch_matmul_precision": torch.get_float32_matmul_precision(),
                                     "products": None, "error": None}
    try:
        from nsa.ops._triton.attention import dot_precision

        out["products"] = dot_precision(torch.float32, torch.device(device), 128)
    except Exception as err:  # noqa: BLE001 - the report records why instead of failing the run
        out["error"] = f"{type(err).__name__}: {err}"
    return out


def _gpus(hw: "HardwareInfo") -> List[Dict[str, Any]]:
    return [{"index": g.index, "name": g.name, "capability": g.sm, "memory_gib": round(g.memory_gib, 2)}
            for g in hw.gpus]


def env_document(state: "NSAState", commit: Tuple[str, Optional[bool]], created: datetime,
                 routing: Mapping[str, Any]) -> Dict[str, Any]:
    """``env.json``: where and with what the run happened.

    Args:
        state: the plugin's state after ``pytest_configure`` (selection, hardware and
            software set).
        commit: from :func:`git_commit`.
        routing: ``{"device": ..., "dtype": ..., "ops": routing_rows(...)}``.
    """
    hw, sw, sel = state.hardware, state.software, state.selection
    profile = sel.profile if sel is not None else None
    applied = state.env
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "nsa-report-env",
        "created": created.isoformat(timespec="seconds"),
        "commit": {"short": commit[0], "dirty": commit[1]},
        "platform": {"system": platform.system(), "release": platform.release(), "machine": platform.machine()},
        "device": {
            "slug": device_slug(hw),
            "description": hw.describe() if hw is not None else "not detected",
            "gpus": _gpus(hw) if hw is not None else [],
            "driver": hw.driver if hw is not None else None,
            "cuda": hw.cuda if hw is not None else None,
            "visible_devices": hw.visible_devices if hw is not None else None,
            "source": hw.source if hw is not None else "not detected",
        },
        "software": {
            "python": sw.python if sw is not None else platform.python_version(),
            "torch": sw.torch if sw is not None else None,
            "triton": sw.triton if sw is not None else None,
            "triton_dist": sw.triton_dist if sw is not None else None,
            "flash_attn": sw.flash_attn if sw is not None else None,
            "torch_triton_pin": sw.torch_triton_pin if sw is not None else None,
            "source": sw.source if sw is not None else "not detected",
        },
        "checks": [{"check": v.check, "level": v.level, "message": v.message, "fix": v.fix} for v in state.verdicts],
        "profile": None if profile is None or sel is None else {
            "name": profile.name, "path": str(profile.path), "description": profile.description,
            "mode": sel.mode, "applied": sel.applied, "note": sel.note, "mismatch": sel.mismatch,
        },
        "flags": {
            "applied": dict(sorted(applied.applied.items())) if applied is not None else {},
            "kept": {k: {"yours": mine, "profile": theirs} for k, (mine, theirs) in sorted(applied.kept.items())}
            if applied is not None else {},
            "in_effect": flags_in_effect(),
        },
        "float32": float32_products(routing["device"]),
        "features": {} if profile is None else
        {name: {"enabled": f.enabled, "reason": f.reason} for name, f in profile.features.items()},
        "routing": dict(routing),
        "warnings": list(state.warnings),
    }


def counts(outcomes: Iterable["TestOutcome"]) -> Dict[str, int]:
    """``{outcome: n for every name in OUTCOMES}`` plus ``total``."""
    found = Counter(o.outcome for o in outcomes)
    out = {name: found.get(name, 0) for name in OUTCOMES}
    out["total"] = sum(found.values())
    return out


def by_marker(outcomes: Sequence["TestOutcome"]) -> Dict[str, Dict[str, int]]:
    """:func:`counts` per row of :data:`MATRIX_ROWS` (a test with two markers counts in both)."""
    rows = {m: counts(o for o in outcomes if m in o.markers) for m in MARKERS}
    rows[MATRIX_ROWS[-1]] = counts(o for o in outcomes if not o.markers)
    return rows


def skips(outcomes: Sequence["TestOutcome"]) -> List[Dict[str, Any]]:
    """Skipped tests grouped by reason, most frequent first: ``reason``, ``count`` and the
    nsa ``markers`` found on those tests."""
    groups: Dict[str, List["TestOutcome"]] = {}
    for o in outcomes:
        if o.outcome == "skipped":
            groups.setdefault(o.skip_reason or "(no reason given)", []).append(o)
    rows = [{"reason": r, "count": len(g), "markers": sorted({m for o in g for m in o.markers})}
            for r, g in groups.items()]
    return sorted(rows, key=lambda row: (-row["count"], row["reason"]))


def _run(run: RunInfo) -> Dict[str, Any]:
    return {
        "started": run.started.isoformat(timespec="seconds"),
        "finished": run.finished.isoformat(timespec="seconds"),
        "duration_s": round((run.finished - run.started).total_seconds(), 3),
        "exit_status": run.exit_status,
        "partial": bool(run.partial_reasons),
        "partial_reasons": list(run.partial_reasons),
        "unfinished": list(run.unfinished),
        "args": list(run.args),
        "collected": run.collected,
        "xdist_workers": run.workers,
        "worker_notes": dict(sorted(run.worker_notes.items())),
    }


def results_document(report_id: str, run: RunInfo, outcomes: Sequence["TestOutcome"],
                     failures: Sequence[Failure], benchmarks: Mapping[str, Any],
                     memory_share_gib: Optional[float] = None) -> Dict[str, Any]:
    """``results.json``: what happened.

    Args:
        report_id: the report folder's name.
        outcomes: one per test that reported (:class:`pytest_nsa.state.TestOutcome`).
        failures: every failed phase and collection error, in the order they happened.
        benchmarks: the benchmark section built by :mod:`pytest_nsa.report_bench`.
        memory_share_gib: each xdist worker's share of its GPU's memory where workers share one.
    """
    totals = counts(outcomes)
    markers = {o.nodeid: o.markers for o in outcomes}
    # A collection error is no test outcome, but pytest counts it among the errors.
    collect_errors = sum(1 for f in failures if f.when == "collect")
    totals["error"] += collect_errors
    totals["total"] += collect_errors
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "nsa-report-results",
        "report_id": report_id,
        "run": _run(run),
        "totals": totals,
        "by_marker": by_marker(outcomes),
        "skips": skips(outcomes),
        "failures": [{"nodeid": f.nodeid, "outcome": f.outcome, "when": f.when, "message": f.message,
                      "markers": list(markers.get(f.nodeid, ()))} for f in failures],
        "tests": [{"nodeid": o.nodeid, "outcome": o.outcome, "markers": list(o.markers),
                   "duration_s": round(o.duration, 6), "skip_reason": o.skip_reason, "worker": o.worker,
                   "comparisons": margins.as_json(o.comparisons), "gpu_memory": gpu_memory.as_json(o.gpu_memory)}
                  for o in outcomes],
        "margins": margins.summary(outcomes),
        "gpu_memory": gpu_memory.summary(outcomes, memory_share_gib),
        "benchmarks": dict(benchmarks),
    }
