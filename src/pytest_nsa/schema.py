"""The schema of a GPU profile file, and its validation with ``file:line`` errors.

No pytest import here. :func:`validate` checks one file's mapping as written
(keys, types, flag names and values) and returns plain, normalised values; keys
may be missing because a profile inherits them through ``extends``.
:func:`missing` then checks that the merged profile states everything.

Every error is a :class:`ProfileError` whose message names the file, the line,
the key path and what is allowed there.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from nsa import flags
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from pytest_nsa._yaml import LinedDict, line_of

DTYPES: Tuple[str, ...] = ("float64", "float32", "float16", "bfloat16")
KINDS: Tuple[str, ...] = ("fwd", "grad")
#: Features a profile switches on or off, each with a reason. ``triton_<op>`` are the
#: per-op Triton kernels, ``triton_float32`` the Triton kernels on float32 inputs (all also off
#: when ``triton`` is off).
FEATURES: Tuple[str, ...] = ("triton", *(f"triton_{op}" for op in flags.OPS), "triton_float32", "fa2")
#: The one variable outside nsa's registry that a profile may set (Triton reads it
#: when kernels are defined; the cpu profile needs it for the interpreter).
EXTRA_ENV: Tuple[str, ...] = ("TRITON_INTERPRET",)
_TRITON_INTERPRET = flags.Flag("TRITON_INTERPRET", bool, False, "Triton's interpreter switch (read by Triton, not nsa)")

_SM_RE = re.compile(r"^(\d+)\.(\d)$")
_MINOR_RE = re.compile(r"^\d+\.\d+$")


class ProfileError(ValueError):
    """A profile cannot be used; the message says where (``file:line``) and why."""


class _At:
    """Where a value sits: file, line and dotted key path."""

    def __init__(self, file: str, line: int, path: str) -> None:
        self.file, self.line, self.path = file, line, path

    def child(self, parent: Any, key: Any) -> "_At":
        line = line_of(parent, key) or self.line
        return _At(self.file, line, f"{self.path}.{key}" if self.path else str(key))

    def error(self, problem: str) -> ProfileError:
        return ProfileError(f"{self.file}:{self.line}: {self.path or 'profile'}: {problem}")


Check = Callable[[Any, _At], Any]


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__.replace("Lined", "").replace("dict", "mapping")


def _text(value: Any, at: _At) -> str:
    if not isinstance(value, str) or not value.strip():
        raise at.error(f"expected non-empty text, got {_type_name(value)} {value!r}")
    return value


def _bool(value: Any, at: _At) -> bool:
    if not isinstance(value, bool):
        raise at.error(f"expected true or false, got {_type_name(value)} {value!r}")
    return value


def _positive(value: Any, at: _At) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise at.error(f"expected a positive number, got {_type_name(value)} {value!r}")
    return float(value)


def _count(value: Any, at: _At) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise at.error(f"expected a positive integer, got {_type_name(value)} {value!r}")
    return value


def _counts(value: Any, at: _At) -> Tuple[int, ...]:
    if not isinstance(value, list) or not value:
        raise at.error(f"expected a non-empty list of positive integers, got {_type_name(value)} {value!r}")
    return tuple(_count(item, at) for item in value)


def _sm(value: Any, at: _At) -> Tuple[int, int]:
    match = _SM_RE.match(str(value)) if isinstance(value, (str, float, int)) and not isinstance(value, bool) else None
    if match is None:
        raise at.error(f"expected a compute capability such as \"8.9\", got {value!r}")
    return int(match.group(1)), int(match.group(2))


def _minor_version(value: Any, at: _At) -> str:
    if not isinstance(value, str):
        raise at.error(f"expected a quoted version such as \"12.1\", got {_type_name(value)} {value!r} "
                       "(unquoted, YAML reads 2.10 as the number 2.1)")
    if not _MINOR_RE.match(value):
        raise at.error(f"expected a major.minor version such as \"12.1\", got {value!r}")
    return value


def _specifier(value: Any, at: _At) -> str:
    text = _text(value, at)
    try:
        SpecifierSet(text)
    except InvalidSpecifier:
        raise at.error(f"expected a version specifier such as \">=2.6\", got {value!r}") from None
    return text


def _regex(value: Any, at: _At) -> str:
    text = _text(value, at)
    try:
        re.compile(text)
    except re.error as err:
        raise at.error(f"invalid regular expression {text!r}: {err}") from None
    return text


def _choice(*allowed: str) -> Check:
    def check(value: Any, at: _At) -> str:
        if value not in allowed:
            raise at.error(f"expected one of {', '.join(allowed)}, got {value!r}")
        return value

    return check


def _env_value(name: str, value: Any, at: _At) -> str:
    """Validate one environment entry against nsa's registry; return its text form."""
    if isinstance(value, (dict, list)) or value is None:
        raise at.error(f"expected a scalar value, got {_type_name(value)}")
    source = f"{at.file}:{at.line}"
    if name in EXTRA_ENV:
        return _TRITON_INTERPRET.format(_TRITON_INTERPRET.parse(value, source))
    try:
        parsed = flags.parse(name, value, source=source)
    except flags.FlagError as err:
        allowed = f" (allowed: NSA_ flags of nsa.flags, and {', '.join(EXTRA_ENV)})" if name not in flags.FLAGS else ""
        raise at.error(f"{err}{allowed}") from None
    return flags.FLAGS[name].format(parsed)


def _env(value: Any, at: _At) -> Dict[str, str]:
    if not isinstance(value, dict):
        raise at.error(f"expected a mapping of NSA_ flags to values, got {_type_name(value)}")
    return {str(name): _env_value(str(name), item, at.child(value, name)) for name, item in value.items()}


def _mapping(fields: Mapping[str, Check]) -> Check:
    """A mapping with a fixed set of optional keys."""

    def check(value: Any, at: _At) -> Dict[str, Any]:
        if not isinstance(value, dict):
            raise at.error(f"expected a mapping with keys {', '.join(fields)}, got {_type_name(value)}")
        out = {}
        for key, item in value.items():
            sub = at.child(value, key)
            if key not in fields:
                raise sub.error(f"unknown key {key!r}; allowed here: {', '.join(fields)}")
            out[key] = fields[key](item, sub)
        return out

    return check


def _keyed(key_check: Callable[[Any, _At], str], item: Check, what: str) -> Check:
    """A mapping whose keys are checked by ``key_check`` and values by ``item``."""

    def check(value: Any, at: _At) -> Dict[str, Any]:
        if not isinstance(value, dict):
            raise at.error(f"expected a mapping of {what}, got {_type_name(value)}")
        return {key_check(k, at.child(value, k)): item(v, at.child(value, k)) for k, v in value.items()}

    return check


def _known(allowed: Tuple[str, ...], what: str) -> Callable[[Any, _At], str]:
    def check(key: Any, at: _At) -> str:
        if key not in allowed:
            raise at.error(f"unknown {what} {key!r}; allowed: {', '.join(allowed)}")
        return key

    return check


_FEATURE = _mapping({"enabled": _bool, "reason": _text, "force": _env})

SCHEMA: Check = _mapping({
    "name": _text,
    "extends": _text,
    "description": _text,
    "abstract": _bool,
    "device": _mapping({
        "kind": _choice("cuda", "cpu"),
        "capability": _sm,
        "name_pattern": _regex,
        "min_memory_gib": _positive,
    }),
    "software": _mapping({
        "cuda_min": _minor_version,
        "flash_attn": _specifier,
        "triton_pairings": _keyed(_minor_version, _minor_version, "torch \"X.Y\" to triton \"X.Y\""),
    }),
    "env": _env,
    "features": _keyed(_known(FEATURES, "feature"), _FEATURE, "features"),
    "tolerances": _keyed(_known(DTYPES, "dtype"), _mapping({"fwd": _positive, "grad": _positive}), "dtypes"),
    "gradcheck": _mapping({"eps": _positive, "atol": _positive, "rtol": _positive}),
    "benchmark": _mapping({
        "contexts": _counts,
        "batch_sizes": _counts,
        "rounds": _count,
        "regression_threshold_pct": _positive,
        "host_bound_threshold_pct": _positive,
        "prefill_lengths": _counts,
    }),
})


def validate(raw: Any, file: str) -> Dict[str, Any]:
    """Check one profile file's top-level mapping; return normalised plain values.

    Raises:
        ProfileError: wrong type, unknown key, unknown ``NSA_`` flag or bad value, with ``file:line``.
    """
    if not isinstance(raw, LinedDict):
        raise ProfileError(f"{file}:1: a profile is a YAML mapping with at least 'name', got {_type_name(raw)}")
    out = SCHEMA(raw, _At(file, raw.line, ""))
    if "name" not in out:
        raise ProfileError(f"{file}:{raw.line}: profile: missing key 'name'")
    return out


#: Keys every usable (non-abstract) profile must have after ``extends`` is applied.
REQUIRED: Tuple[str, ...] = (
    "device.kind",
    *(f"tolerances.{d}.{k}" for d in DTYPES for k in KINDS),
    "gradcheck.eps", "gradcheck.atol", "gradcheck.rtol",
    "benchmark.contexts", "benchmark.batch_sizes", "benchmark.rounds",
    "benchmark.regression_threshold_pct", "benchmark.host_bound_threshold_pct", "benchmark.prefill_lengths",
    *(f"features.{f}.{k}" for f in FEATURES for k in ("enabled", "reason")),
)


def lookup(values: Mapping[str, Any], dotted: str) -> Optional[Any]:
    """``values["a"]["b"]`` for ``"a.b"``, ``None`` where a level is missing."""
    node: Any = values
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def missing(merged: Mapping[str, Any]) -> List[str]:
    """The :data:`REQUIRED` keys absent from a merged profile (plus ``device.capability``
    for a ``cuda`` profile)."""
    absent = [key for key in REQUIRED if lookup(merged, key) is None]
    if lookup(merged, "device.kind") == "cuda" and lookup(merged, "device.capability") is None:
        absent.append("device.capability")
    return absent
