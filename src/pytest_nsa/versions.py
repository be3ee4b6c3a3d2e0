"""Installed software and whether it fits together: torch, triton, flash-attn, CUDA.

No pytest import here (unit-testable). Versions come from package metadata
(``importlib.metadata``), not from importing torch or Triton; the interpreter's minimum Triton
is :mod:`nsa.routing`'s, which the library itself applies (imported where a check needs it:
``nsa.routing`` imports torch). The torch/triton check
treats the ``Requires-Dist`` pin of the installed torch wheel as the authority,
and a profile's pairing table (torch ``X.Y`` -> triton ``X.Y``) as the fallback
when torch declares no pin (CPU and source builds) and as a cross-check.
"""

from __future__ import annotations

import importlib.metadata as metadata
import platform
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Tuple

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

#: Distribution names under which torch's Triton is shipped (release, nightly, ROCm, XPU).
TRITON_DISTS: Tuple[str, ...] = ("triton", "pytorch-triton", "pytorch-triton-rocm", "pytorch-triton-xpu")

OK, WARNING, ERROR = "ok", "warning", "error"


@dataclass(frozen=True)
class SoftwareInfo:
    """Versions of the stack, ``None`` for what is not installed.

    Attributes:
        python: e.g. ``"3.11.7"``.
        torch: e.g. ``"2.5.1+cu124"``.
        triton: version of the installed Triton distribution.
        triton_dist: which distribution provides it (see :data:`TRITON_DISTS`).
        flash_attn: e.g. ``"2.7.4"``.
        torch_triton_pin: torch's own requirement on Triton for this platform,
            e.g. ``"triton==3.1.0"``; ``None`` when torch declares none.
        source: ``"detected"`` or a note from a fake.
    """

    python: str
    torch: Optional[str] = None
    triton: Optional[str] = None
    triton_dist: Optional[str] = None
    flash_attn: Optional[str] = None
    torch_triton_pin: Optional[str] = None
    source: str = "detected"

    def describe(self) -> str:
        parts = [f"Python {self.python}"]
        for label, value in (("torch", self.torch), ("triton", self.triton), ("flash-attn", self.flash_attn)):
            parts.append(f"{label} {value}" if value else f"{label} not installed")
        text = ", ".join(parts)
        return text if self.source == "detected" else f"{text} [{self.source}]"


@dataclass(frozen=True)
class Verdict:
    """The outcome of one software check: ``level`` is ``ok``, ``warning`` or ``error``;
    ``fix`` says what to do when it is not ``ok``."""

    check: str
    level: str
    message: str
    fix: Optional[str] = None

    def describe(self) -> str:
        text = f"{self.level}: {self.message}"
        return f"{text}; fix: {self.fix}" if self.fix else text


def _version_of(dist: str) -> Optional[str]:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def triton_pin(requires: Optional[list], environment: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The Triton requirement among torch's ``Requires-Dist`` lines that applies on this
    platform (environment markers evaluated, extras ignored), e.g. ``"triton==3.1.0"``."""
    env = {"extra": "", **(environment or {})}
    for line in requires or ():
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.name.lower() not in TRITON_DISTS:
            continue
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        return f"{req.name}{req.specifier}"
    return None


def detect(version_of: Callable[[str], Optional[str]] = _version_of) -> SoftwareInfo:
    """Read the installed versions from package metadata (imports none of them)."""
    torch_version = version_of("torch")
    requires = None
    if torch_version is not None:
        try:
            requires = metadata.requires("torch")
        except metadata.PackageNotFoundError:
            requires = None
    triton_version, triton_dist = None, None
    for dist in TRITON_DISTS:
        triton_version = version_of(dist)
        if triton_version is not None:
            triton_dist = dist
            break
    return SoftwareInfo(
        python=platform.python_version(),
        torch=torch_version,
        triton=triton_version,
        triton_dist=triton_dist,
        flash_attn=version_of("flash-attn"),
        torch_triton_pin=triton_pin(requires),
    )


def _minor(version: str) -> str:
    v = Version(version)
    return f"{v.major}.{v.minor}"


def pinned_minor(pin: str) -> Optional[str]:
    """The Triton minor release ``"X.Y"`` that ``pin`` holds to, if it holds to one.

    torch pinned an exact release up to 2.11 (``triton==3.6.0``) and a compatible one from 2.14
    (``triton~=3.8.0``, which admits 3.8.* only); ``~=X.Y`` admits every X.* and holds no minor."""
    for spec in Requirement(pin).specifier:
        exact = spec.operator in ("==", "===") and "*" not in spec.version
        compatible = spec.operator == "~=" and len(Version(spec.version).release) >= 3
        if exact or compatible:
            return _minor(spec.version)
    return None


def _pin_check(sw: SoftwareInfo, pin: str) -> Verdict:
    req = Requirement(pin)
    expected = [s.version for s in req.specifier if s.operator in ("==", "===")]
    if sw.triton is None:
        return Verdict("pairing", WARNING, f"torch {sw.torch} pins {pin} but Triton is not installed; Triton tests skip",
                       f"pip install '{pin}'")
    found = Version(sw.triton)
    if req.specifier.contains(found, prereleases=True):
        return Verdict("pairing", OK, f"triton {sw.triton} matches torch {sw.torch}'s pin ({pin})")
    minor = pinned_minor(pin)
    if minor is not None and minor != _minor(sw.triton):
        want = f"{minor}.x"
    else:
        want = expected[0] if expected else str(req.specifier)
    return Verdict("pairing", ERROR, f"torch {sw.torch} expects triton {want}, found {sw.triton}", f"pip install '{pin}'")


def check_pairing(sw: SoftwareInfo, table: Mapping[str, str], profile: str) -> Tuple[Verdict, ...]:
    """Verdicts on the torch/triton pairing: torch's metadata pin first, then ``table``
    (torch ``"X.Y"`` -> triton ``"X.Y"``) of the profile named ``profile``."""
    if sw.torch is None:
        return (Verdict("pairing", ERROR, "torch is not installed", "pip install torch"),)
    try:
        torch_minor = _minor(sw.torch)
        row = table.get(torch_minor)
        if sw.torch_triton_pin is not None:
            out = [_pin_check(sw, sw.torch_triton_pin)]
            minor = pinned_minor(sw.torch_triton_pin)
            if row is not None and minor is not None and minor != row:
                out.append(Verdict("pairing-table", WARNING,
                                   f"profile {profile} pairs torch {torch_minor} with triton {row}.x but torch pins "
                                   f"{sw.torch_triton_pin}; torch's pin wins", f"update the table of profile {profile}"))
            return tuple(out)
        if Version(sw.torch).local == "cpu":
            # the library's own rule, so that routing and the test plugin cannot disagree
            from nsa.routing import INTERPRETER_FIX, interpreter_problem

            problem = interpreter_problem(sw.triton) if sw.triton else None
            if problem is not None:
                return (Verdict("pairing", WARNING, f"torch {sw.torch} is a CPU build and declares no triton pin; "
                                f"{problem}, so the Triton tests skip", INTERPRETER_FIX),)
            what = f"triton {sw.triton} used for the interpreter" if sw.triton else "no triton: interpreter tests skip"
            return (Verdict("pairing", OK, f"torch {sw.torch} is a CPU build and declares no triton pin; {what}"),)
        if sw.triton is None:
            return (Verdict("pairing", OK, f"torch {sw.torch} declares no triton pin and triton is not installed"),)
        if row is None:
            return (Verdict("pairing", WARNING,
                            f"torch {sw.torch} declares no triton pin and profile {profile} has no row for torch "
                            f"{torch_minor}; triton {sw.triton} is unchecked", f"add torch {torch_minor} to the table"),)
        if _minor(sw.triton) == row:
            return (Verdict("pairing", OK, f"triton {sw.triton} fits torch {sw.torch} (profile {profile} table)"),)
        return (Verdict("pairing", ERROR,
                        f"torch {sw.torch} expects triton {row}.x (profile {profile} table), found {sw.triton}",
                        f"pip install 'triton=={row}.*'"),)
    except (InvalidVersion, InvalidRequirement) as err:
        return (Verdict("pairing", WARNING, f"cannot read versions (torch {sw.torch}, triton {sw.triton}): {err}"),)


def check_cuda(cuda: Optional[str], minimum: Optional[str], profile: str) -> Optional[Verdict]:
    """Verdict on torch's CUDA version against the profile's ``cuda_min`` (``None``: nothing to check)."""
    if minimum is None:
        return None
    if cuda is None:
        return Verdict("cuda", ERROR, f"profile {profile} needs CUDA >= {minimum}, torch is a CPU build",
                       "install a CUDA build of torch")
    if Version(cuda) < Version(minimum):
        return Verdict("cuda", ERROR, f"profile {profile} needs CUDA >= {minimum}, torch has CUDA {cuda}",
                       f"install a torch build for CUDA >= {minimum}")
    return Verdict("cuda", OK, f"CUDA {cuda} >= {minimum}")


def check_flash_attn(installed: Optional[str], spec: Optional[str], profile: str) -> Optional[Verdict]:
    """Verdict on the installed flash-attn against the profile's specifier (``None``: nothing to check)."""
    if installed is None or spec is None:
        return None
    try:
        fits = SpecifierSet(spec).contains(Version(installed), prereleases=True)
    except (InvalidSpecifier, InvalidVersion) as err:
        return Verdict("flash-attn", WARNING, f"cannot compare flash-attn {installed} with {spec!r}: {err}")
    if fits:
        return Verdict("flash-attn", OK, f"flash-attn {installed} fits {spec}")
    return Verdict("flash-attn", WARNING, f"flash-attn {installed} is outside profile {profile}'s {spec}; fa2 tests skip",
                   f"pip install 'flash-attn{spec}'")
