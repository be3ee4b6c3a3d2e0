"""Text the plugin shows: report header, terminal summary, ``--gpu-profile-list``.

No pytest import: each function takes plain objects and returns lines.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple, Union

from pytest_nsa.profiles import Catalog, Profile, describe
from pytest_nsa.state import NSAState


def header(state: NSAState) -> List[str]:
    """``pytest_report_header`` lines: profile, device, versions, verdicts, flags, features."""
    sel, hw, sw = state.selection, state.hardware, state.software
    if sel is None or hw is None or sw is None:
        return ["nsa: not configured"]
    profile = sel.profile
    lines = [f"nsa profile: {profile.name} ({profile.path}; {sel.note})"]
    if sel.mismatch is not None:
        lines.append(f"nsa profile MISMATCH: {sel.mismatch}; GPU tests skip (--gpu-profile-mismatch=skip)")
    lines.append(f"nsa device: {hw.describe()}")
    lines.append(f"nsa software: {sw.describe()}")
    lines += [f"nsa check {v.check}: {v.describe()}" for v in state.verdicts]
    if sel.applied:
        lines.append(f"nsa flags: {state.env.describe() if state.env is not None else 'none'}")
    else:
        lines.append("nsa flags: none applied (passive; --gpu-profile auto, NAME or PATH applies a profile's)")
    off = [f"{name} ({feat.reason})" for name, feat in profile.features.items() if not feat.enabled]
    lines.append(f"nsa features off: {'; '.join(off) or 'none'}")
    if state.pin is not None:
        lines.append(f"nsa xdist: {state.pin.describe()}")
    lines += [f"nsa warning: {w}" for w in state.warnings]
    return lines


def skip_summary(state: NSAState) -> List[str]:
    """Terminal-summary lines: skipped tests grouped by reason with counts (empty when none)."""
    groups = state.results.skips_by_reason()
    if not groups:
        return []
    width = len(str(max(count for _, count in groups)))
    return [f"{count:>{width}}  {reason}" for reason, count in groups]


def worker_summary(state: NSAState) -> List[str]:
    """One line per xdist worker with the device it was pinned to."""
    return [f"{worker}: {note}" for worker, note in sorted(state.workers.items())]


def profile_list(catalog: Catalog) -> List[str]:
    """``--gpu-profile-list``: one line per profile file, then where they were found."""
    entries: Sequence[Tuple[str, Union[Profile, str]]] = catalog.survey()
    lines = []
    for name, entry in entries:
        lines.append(describe(entry) if isinstance(entry, Profile) else f"{name:<10} {entry}")
    lines.append("searched: " + ", ".join(str(d) for d in catalog.dirs))
    lines.append("use: --gpu-profile NAME | auto | path/to/profile.yaml")
    return lines
