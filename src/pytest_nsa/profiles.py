"""GPU profiles: loading, ``extends``, and the frozen :class:`Profile` the tests see.

No pytest import here (unit-testable). A profile is one YAML file (schema in
:mod:`pytest_nsa.schema`); ``extends: <name>`` inherits another profile's
values, mappings merged key by key and everything else replaced. Profiles are
found by name in a :class:`Catalog` of directories (the project's
``gpu_profiles/`` first, then the ones shipped with nsa), or loaded
from a path.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from pytest_nsa import _yaml
from pytest_nsa.schema import DTYPES, FEATURES, KINDS, ProfileError, lookup, missing, validate


def _shipped_dir(module: Path) -> Path:
    """Where the shipped profiles of ``module`` (this file's resolved path) are."""
    checkout = module.parents[2] / "gpu_profiles"
    # A checkout (or editable install) keeps the one copy at the repository root (also
    # where --nsa-baseline=save writes when run there); a wheel carries a copy inside the package.
    return checkout if checkout.is_dir() else module.parent / "gpu_profiles"


#: Profiles shipped with nsa: ``<repo>/gpu_profiles`` in a source checkout or editable
#: install, else the copy a wheel installs as ``pytest_nsa/gpu_profiles``.
SHIPPED_DIR = _shipped_dir(Path(__file__).resolve())


class AbstractProfileError(ProfileError):
    """The profile is marked ``abstract: true``: a base to extend, not one to run with."""


@dataclass(frozen=True)
class DeviceSpec:
    """How to recognise the device: ``kind`` ``"cuda"`` or ``"cpu"``; for CUDA the exact
    ``capability``, a case-sensitive regex ``name_pattern`` and ``min_memory_gib``."""

    kind: str
    capability: Optional[Tuple[int, int]] = None
    name_pattern: Optional[str] = None
    min_memory_gib: float = 0.0

    @property
    def sm(self) -> Optional[str]:
        return None if self.capability is None else f"{self.capability[0]}.{self.capability[1]}"


@dataclass(frozen=True)
class SoftwareSpec:
    """Accepted software: minimum CUDA, a flash-attn specifier, and the torch ``X.Y`` to
    triton ``X.Y`` table used when torch's own metadata declares no Triton pin."""

    cuda_min: Optional[str] = None
    flash_attn: Optional[str] = None
    triton_pairings: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class Feature:
    """A switchable capability with the reason for its state. ``force`` lists environment
    values that turn a disabled feature on when the user sets them."""

    name: str
    enabled: bool
    reason: str
    force: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class Tolerance:
    """RMS-relative error bounds (``nsa.testing.rel_error``) for the forward and the gradients."""

    fwd: float
    grad: float


@dataclass(frozen=True)
class BenchmarkSettings:
    """Settings of the benchmark suites: context lengths and batch sizes for decode,
    ``rounds`` per measurement, the regression threshold in percent (and the one for host-bound
    benchmarks, :func:`nsa.bench.baselines.host_bound`) and prefill lengths."""

    contexts: Tuple[int, ...]
    batch_sizes: Tuple[int, ...]
    rounds: int
    regression_threshold_pct: float
    host_bound_threshold_pct: float
    prefill_lengths: Tuple[int, ...]


@dataclass(frozen=True)
class Profile:
    """A fully resolved profile (``extends`` applied). Frozen: tests read it, never change it.

    Attributes:
        name: profile name, e.g. ``"rtx4090"``.
        path: the file it was loaded from.
        chain: names from this profile up through the ones it extends.
        env: environment values to apply (text form), flags validated by ``nsa.flags``.
        features: every name of :data:`pytest_nsa.schema.FEATURES`.
        tolerances: dtype name (``"float32"``...) -> :class:`Tolerance`.
        gradcheck: ``eps``, ``atol``, ``rtol`` for ``torch.autograd.gradcheck``.
    """

    name: str
    path: Path
    description: str
    chain: Tuple[str, ...]
    device: DeviceSpec
    software: SoftwareSpec
    env: Mapping[str, str]
    features: Mapping[str, Feature]
    tolerances: Mapping[str, Tolerance]
    gradcheck: Mapping[str, float]
    benchmark: BenchmarkSettings

    def tolerance(self, dtype: str, kind: str = "fwd") -> float:
        """The bound for ``dtype`` (``"float64"``, ``"float32"``, ``"float16"``, ``"bfloat16"``)
        and ``kind`` (``"fwd"`` or ``"grad"``)."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        if dtype not in self.tolerances:
            raise ValueError(f"profile {self.name} has no tolerance for dtype {dtype!r}; it has {', '.join(DTYPES)}")
        return getattr(self.tolerances[dtype], kind)

    def feature(self, name: str) -> Feature:
        if name not in self.features:
            raise ValueError(f"unknown feature {name!r}; features are {', '.join(FEATURES)}")
        return self.features[name]


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> Dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _build(values: Mapping[str, Any], path: Path, chain: Tuple[str, ...]) -> Profile:
    absent = missing(values)
    if absent:
        via = f" nor in the profiles it extends ({', '.join(chain[1:])})" if len(chain) > 1 else ""
        raise ProfileError(f"{path}: profile {chain[0]} lacks {', '.join(absent)} (not in this file{via})")
    device = values["device"]
    software = values.get("software", {})
    features = {
        name: Feature(name, spec["enabled"], spec["reason"], MappingProxyType(dict(spec.get("force", {}))))
        for name, spec in values["features"].items()
    }
    return Profile(
        name=values["name"],
        path=path,
        description=values.get("description", ""),
        chain=chain,
        device=DeviceSpec(device["kind"], device.get("capability"), device.get("name_pattern"),
                          device.get("min_memory_gib", 0.0)),
        software=SoftwareSpec(software.get("cuda_min"), software.get("flash_attn"),
                              MappingProxyType(dict(software.get("triton_pairings", {})))),
        env=MappingProxyType(dict(values.get("env", {}))),
        features=MappingProxyType(features),
        tolerances=MappingProxyType({d: Tolerance(**values["tolerances"][d]) for d in DTYPES}),
        gradcheck=MappingProxyType(dict(values["gradcheck"])),
        benchmark=BenchmarkSettings(**values["benchmark"]),
    )


def read(path: Path) -> Dict[str, Any]:
    """Load and validate one file as written (no ``extends`` applied)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ProfileError(f"{path}: cannot read profile: {err.strerror or err}") from None
    try:
        raw = _yaml.load(text, str(path))
    except _yaml.YAMLLoadError as err:
        raise ProfileError(str(err)) from None
    return validate(raw, str(path))


def is_path(spec: str) -> bool:
    """Whether a ``--gpu-profile`` value names a file rather than a profile."""
    return "/" in spec or "\\" in spec or spec.endswith((".yaml", ".yml"))


class Catalog:
    """Profiles by name from ``dirs`` (an earlier directory shadows a later one)."""

    def __init__(self, dirs: Sequence[Path]) -> None:
        self.dirs: Tuple[Path, ...] = tuple(dict.fromkeys(Path(d) for d in dirs))
        self._cache: Dict[Path, Profile] = {}

    def files(self) -> Dict[str, Path]:
        """``{name: path}`` of every ``*.yaml`` in the directories, the first directory winning."""
        found: Dict[str, Path] = {}
        for folder in self.dirs:
            if folder.is_dir():
                for path in sorted(folder.glob("*.yaml")):
                    found.setdefault(path.stem, path)
        return found

    def names(self) -> List[str]:
        return sorted(self.files())

    def _find(self, name: str, near: Optional[Path]) -> Path:
        if near is not None and (near / f"{name}.yaml").is_file():
            return near / f"{name}.yaml"
        files = self.files()
        if name not in files:
            hint = difflib.get_close_matches(name, list(files), n=1)
            known = f"did you mean {hint[0]}? " if hint else ""
            where = ", ".join(str(d) for d in self.dirs)
            raise ProfileError(f"unknown GPU profile {name!r}; {known}known: {', '.join(sorted(files)) or 'none'} "
                               f"(searched {where})")
        return files[name]

    def _path(self, spec: Union[str, Path]) -> Path:
        return (Path(spec) if isinstance(spec, Path) or is_path(spec) else self._find(spec, None)).resolve()

    def load(self, spec: Union[str, Path]) -> Profile:
        """The profile named ``spec``, or loaded from the path ``spec``, with ``extends`` applied.

        Raises:
            ProfileError: unknown name, unreadable or invalid file, ``extends`` cycle,
                an abstract profile, or keys missing after inheritance.
        """
        path = self._path(spec)
        if path not in self._cache:
            layers, chain = self._layers(path)
            if layers[0].get("abstract", False):
                raise AbstractProfileError(f"{path}: profile {chain[0]} is abstract (a base for others to extend)")
            merged: Dict[str, Any] = {}
            for layer in reversed(layers):
                merged = _merge(merged, {k: v for k, v in layer.items() if k not in ("abstract", "extends")})
            self._cache[path] = _build(merged, path, chain)
        return self._cache[path]

    def _layers(self, path: Path) -> Tuple[List[Dict[str, Any]], Tuple[str, ...]]:
        """The validated files from ``path`` up its ``extends`` chain, and their names."""
        layers: List[Dict[str, Any]] = []
        chain: List[str] = []
        shipped = {d.resolve() for d in self.dirs}
        current = path
        while True:
            values = read(current)
            if current.parent in shipped and values["name"] != current.stem:
                raise ProfileError(f"{current}:1: name {values['name']!r} differs from the file name {current.name}")
            if values["name"] in chain:
                raise ProfileError(f"{path}: extends cycle: {' -> '.join([*chain, values['name']])}")
            chain.append(values["name"])
            layers.append(values)
            parent = values.get("extends")
            if parent is None:
                return layers, tuple(chain)
            current = self._find(parent, current.parent).resolve()

    def usable(self) -> List[str]:
        """Names of the profiles that load and are not abstract."""
        return [name for name, entry in self.survey() if isinstance(entry, Profile)]

    def survey(self) -> List[Tuple[str, Union[Profile, str]]]:
        """Every profile file by name: its :class:`Profile`, or a line saying why it is not
        usable (abstract base, or the error that stops it)."""
        out: List[Tuple[str, Union[Profile, str]]] = []
        for name in self.names():
            try:
                out.append((name, self.load(name)))
            except AbstractProfileError:
                out.append((name, "abstract base for other profiles"))
            except ProfileError as err:
                out.append((name, f"INVALID: {err}"))
        return out


def describe(profile: Profile) -> str:
    """One line for ``--gpu-profile-list``: name, device, what it turns off."""
    dev = profile.device
    if dev.kind == "cpu":
        what = "CPU only"
    else:
        what = f"SM {dev.sm}" + (f", name ~ /{dev.name_pattern}/" if dev.name_pattern else "")
        what += f", >= {dev.min_memory_gib:g} GiB" if dev.min_memory_gib else ""
    off = [name for name, feat in profile.features.items() if not feat.enabled]
    extends = f" (extends {profile.chain[1]})" if len(profile.chain) > 1 else ""
    return f"{profile.name:<10} {what}; off: {', '.join(off) or 'nothing'}{extends} - {profile.description}"


__all__ = ["AbstractProfileError", "Catalog", "DeviceSpec", "Feature", "Profile", "ProfileError", "SHIPPED_DIR", "Tolerance", "lookup"]
