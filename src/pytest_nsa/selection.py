"""Which profile a run uses, and whether it fits the device.

No pytest import here. :func:`select` turns the ``--gpu-profile`` value
(``None``/``"none"``, ``"auto"``, a name or a path) and the detected hardware
into a :class:`Selection`, or raises :class:`ProfileError` with what to do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Optional, Tuple

from pytest_nsa.hardware import HardwareInfo
from pytest_nsa.profiles import AbstractProfileError, Catalog, Profile, ProfileError, is_path

MISMATCH_POLICIES: Tuple[str, ...] = ("error", "skip")
#: The profile ``auto`` picks without a GPU, and the values a passive run falls back to.
CPU_PROFILE = "cpu"


@dataclass(frozen=True)
class Selection:
    """The outcome of profile selection.

    Attributes:
        profile: the profile whose values the run uses.
        mode: ``"passive"`` (``--gpu-profile none``, or another of the plugin's options without
            ``--gpu-profile``: values only, nothing applied),
            ``"auto"``, ``"named"`` or ``"path"``.
        mismatch: why the profile does not fit the device (GPU tests then skip), or ``None``.
        note: how the profile was chosen, for the report header.
    """

    profile: Profile
    mode: str
    mismatch: Optional[str] = None
    note: str = ""

    @property
    def applied(self) -> bool:
        """Whether the profile's flags are applied and its features enforced."""
        return self.mode != "passive"


def mismatch(profile: Profile, hardware: HardwareInfo) -> Optional[str]:
    """Why ``profile`` does not describe ``hardware``'s first GPU, or ``None`` if it does.
    A ``cpu`` profile fits every machine (it leaves any GPU unused)."""
    spec = profile.device
    if spec.kind == "cpu":
        return None
    gpu = hardware.primary
    if gpu is None:
        return f"profile {profile.name} needs a CUDA GPU (SM {spec.sm}), none is visible"
    if gpu.capability != spec.capability:
        return f"profile {profile.name} wants SM {spec.sm}, device 0 is {gpu.describe()}"
    if spec.name_pattern and not re.search(spec.name_pattern, gpu.name):
        return f"profile {profile.name} wants a device named like /{spec.name_pattern}/, device 0 is {gpu.describe()}"
    if gpu.memory_gib < spec.min_memory_gib:
        return f"profile {profile.name} wants >= {spec.min_memory_gib:g} GiB, device 0 is {gpu.describe()}"
    return None


def _specificity(profile: Profile) -> Tuple[bool, float]:
    return profile.device.name_pattern is not None, profile.device.min_memory_gib


def auto(catalog: Catalog, hardware: HardwareInfo) -> Tuple[Optional[Profile], str]:
    """The profile matching ``hardware`` and how it was found; ``(None, why)`` when none does.

    Without a GPU this is the ``cpu`` profile. With one, among the CUDA profiles that
    fit, the most specific wins (a name pattern, then the largest memory minimum).
    """
    if hardware.primary is None:
        return catalog.load(CPU_PROFILE), "no CUDA GPU visible"
    fits: List[Profile] = []
    misses: List[str] = []
    for name in catalog.usable():
        profile = catalog.load(name)
        if profile.device.kind != "cuda":
            continue
        why = mismatch(profile, hardware)
        if why is None:
            fits.append(profile)
        else:
            misses.append(why)
    if not fits:
        detail = "; ".join(misses) or "no CUDA profiles"
        return None, f"no profile matches {hardware.primary.describe()} ({detail})"
    best = max(fits, key=_specificity)
    return best, f"matches {hardware.primary.describe()}"


def select(request: Optional[str], hardware: HardwareInfo, catalog: Catalog, on_mismatch: str = "error") -> Selection:
    """Resolve ``--gpu-profile`` (``request``) against ``hardware``.

    Args:
        request: ``None`` or ``"none"`` (passive), ``"auto"``, a profile name or a path.
        on_mismatch: ``"error"`` raises when the profile does not fit the device;
            ``"skip"`` returns a :class:`Selection` with ``mismatch`` set.

    Raises:
        ProfileError: unknown/invalid profile, or a mismatch under ``"error"``.
    """
    if on_mismatch not in MISMATCH_POLICIES:
        raise ValueError(f"on_mismatch must be one of {', '.join(MISMATCH_POLICIES)}, got {on_mismatch!r}")
    if request is None or request == "none":
        found, why = auto(catalog, hardware)
        if found is None:
            return Selection(catalog.load(CPU_PROFILE), "passive", None, f"passive; {why}; values from {CPU_PROFILE}")
        return Selection(found, "passive", None, f"passive (values only, flags not applied); {why}")
    if request == "auto":
        found, why = auto(catalog, hardware)
        if found is not None:
            return Selection(found, "auto", None, f"--gpu-profile auto: {why}")
        if on_mismatch == "skip":
            return Selection(catalog.load(CPU_PROFILE), "auto", why, f"--gpu-profile auto: {why}")
        raise ProfileError(f"--gpu-profile auto: {why}. Write a profile for this device (see pytest_nsa's README), "
                           "or pass --gpu-profile-mismatch=skip to run on the CPU with GPU tests skipped")
    mode = "path" if is_path(request) else "named"
    try:
        profile = catalog.load(request)
    except AbstractProfileError as err:
        raise ProfileError(f"{err}; pick one of {', '.join(catalog.usable())}") from None
    why = mismatch(profile, hardware)
    if why is not None and on_mismatch == "error":
        raise ProfileError(f"--gpu-profile {request}: {why}. Use --gpu-profile auto, or "
                           "--gpu-profile-mismatch=skip to run anyway with the GPU tests skipped")
    return Selection(profile, mode, why, f"--gpu-profile {request}")
