"""Markers of pytest_nsa and what each needs from the machine.

No pytest import here: :func:`skip_reason` takes marker names with their
arguments and a :class:`Context`, and returns the precise reason a test cannot
run here (or ``None``). The plugin turns a reason into a skip, never a
deselection, so every xdist worker collects the same tests.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Tuple

from pytest_nsa.hardware import HardwareInfo
from pytest_nsa.profiles import Profile
from pytest_nsa.schema import FEATURES
from pytest_nsa.versions import OK, SoftwareInfo, Verdict

#: ``name: help`` of every marker, as ``pytest --markers`` shows them.
MARKERS: Dict[str, str] = {
    "parity": "parity: compares an nsa path with the reference; bounds from the nsa_tolerance fixture",
    "gradcheck": "gradcheck: torch.autograd.gradcheck of an op; settings from nsa_gradcheck_tolerance",
    "gpu": "gpu: needs a CUDA GPU that the active GPU profile uses; skipped with the reason otherwise",
    "triton": "triton: runs nsa's Triton kernels; on CUDA needs triton and the profile's 'triton' feature, "
              "on CPU the interpreter (TRITON_INTERPRET=1, set by the cpu profile)",
    "fa2": "fa2: uses flash-attn 2; needs a CUDA GPU, flash_attn installed and the profile's 'fa2' feature on",
    "benchmark": "benchmark: a performance measurement (settings from the profile's benchmark section)",
    "long_context": "long_context: long sequences (memory- and time-hungry); deselect with -m 'not long_context'",
    "exclusive": "exclusive: needs its GPU to itself (it times the device); xdist workers that share the GPU "
                 "wait while it runs, as for long_context",
    "requires": "requires(sm=None, memory_gib=None, triton=None, fa2=None, gpu_count=None, feature=None): "
                "skip unless the device and profile provide all of them, e.g. "
                "requires(sm='>=9.0', memory_gib=40, feature='triton_selected')",
}

REQUIRES_KEYS: Tuple[str, ...] = ("sm", "memory_gib", "triton", "fa2", "gpu_count", "feature")
_SM_RE = re.compile(r"^\s*(>=|<=|==|!=|>|<)?\s*(\d+)\.(\d)\s*$")
_OPS: Dict[str, Callable[[Any, Any], bool]] = {
    ">=": operator.ge, "<=": operator.le, "==": operator.eq, "!=": operator.ne, ">": operator.gt, "<": operator.lt,
}


class RequirementError(ValueError):
    """A marker is used with arguments it does not take."""


@dataclass(frozen=True)
class Context:
    """What the run has, for judging requirements.

    Attributes:
        profile: the profile whose features and name the reasons use.
        gpu_block: why GPU tests skip although a GPU may be present (a CPU profile, or
            a profile that does not match the device), or ``None``.
        environ: the environment after the profile is applied (for ``force`` and
            ``TRITON_INTERPRET``).
        fa2_verdict: the flash-attn version check, if any.
    """

    hardware: HardwareInfo
    software: SoftwareInfo
    profile: Profile
    gpu_block: Optional[str]
    environ: Mapping[str, str]
    fa2_verdict: Optional[Verdict] = None

    @property
    def uses_gpu(self) -> bool:
        return self.gpu_block is None and self.hardware.primary is not None


def _gpu(ctx: Context) -> Optional[str]:
    if ctx.gpu_block is not None:
        return ctx.gpu_block
    if ctx.hardware.primary is None:
        return f"needs a CUDA GPU, none is visible ({ctx.profile.name})"
    return None


def _interpreter_on(environ: Mapping[str, str]) -> bool:
    return environ.get("TRITON_INTERPRET", "").strip().lower() in {"1", "true", "yes", "on"}


def _feature(ctx: Context, name: str) -> Optional[str]:
    if name not in FEATURES:
        raise RequirementError(f"unknown feature {name!r}; features are {', '.join(FEATURES)}")
    if name.startswith("triton_"):
        parent = _feature(ctx, "triton")
        if parent is not None:
            return parent
    feat = ctx.profile.feature(name)
    if feat.enabled:
        return None
    for key, value in feat.force.items():
        if ctx.environ.get(key, "").strip().lower() == value.lower():
            return None
    return f"{name} off in profile {ctx.profile.name}: {feat.reason}"


def _triton(ctx: Context) -> Optional[str]:
    if ctx.software.triton is None:
        return "triton is not installed"
    off = _feature(ctx, "triton")
    if off is not None:
        return off
    if not ctx.uses_gpu and not _interpreter_on(ctx.environ):
        return ("Triton on CPU needs the interpreter: TRITON_INTERPRET=1 is not set "
                "(--gpu-profile cpu or auto sets it)")
    if ctx.uses_gpu:
        return None
    from nsa.routing import INTERPRETER_FIX, interpreter_problem  # torch: imported once a test is judged

    problem = interpreter_problem(ctx.software.triton)
    return f"{problem}; fix: {INTERPRETER_FIX}" if problem else None


def _fa2(ctx: Context) -> Optional[str]:
    gpu = _gpu(ctx)
    if gpu is not None:
        return f"flash-attn {gpu}" if ctx.gpu_block is None else gpu
    if ctx.software.flash_attn is None:
        return "flash_attn is not installed"
    if ctx.fa2_verdict is not None and ctx.fa2_verdict.level != OK:
        return ctx.fa2_verdict.message
    return _feature(ctx, "fa2")


def parse_sm(spec: Any) -> Tuple[str, Tuple[int, int]]:
    """``">=9.0"`` -> ``(">=", (9, 0))``; a bare ``"8.9"`` or ``8.9`` means ``>=``."""
    match = _SM_RE.match(str(spec)) if isinstance(spec, (str, float, int)) and not isinstance(spec, bool) else None
    if match is None:
        raise RequirementError(f"requires(sm={spec!r}): expected e.g. '>=9.0', '==8.9' or '8.0'")
    return match.group(1) or ">=", (int(match.group(2)), int(match.group(3)))


def _number(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise RequirementError(f"requires({key}={value!r}): expected a positive number")
    return float(value)


def _requires(ctx: Context, kwargs: Mapping[str, Any]) -> Optional[str]:
    unknown = sorted(set(kwargs) - set(REQUIRES_KEYS))
    if unknown:
        raise RequirementError(f"requires() got {', '.join(unknown)}; it takes {', '.join(REQUIRES_KEYS)}")
    label = ctx.profile.name
    if any(kwargs.get(k) is not None for k in ("sm", "memory_gib", "gpu_count")):
        sm = parse_sm(kwargs["sm"]) if kwargs.get("sm") is not None else None
        memory = _number("memory_gib", kwargs["memory_gib"]) if kwargs.get("memory_gib") is not None else None
        count = int(_number("gpu_count", kwargs["gpu_count"])) if kwargs.get("gpu_count") is not None else None
        gpu = _gpu(ctx)
        if gpu is not None:
            return gpu
        have = ctx.hardware.gpus[0]
        if sm is not None and not _OPS[sm[0]](have.capability, sm[1]):
            return f"needs SM {sm[0]} {sm[1][0]}.{sm[1][1]}, have {have.sm} ({label})"
        if memory is not None and have.memory_gib < memory:
            return f"needs {memory:g} GiB of GPU memory, have {have.memory_gib:.1f} GiB ({label})"
        if count is not None and ctx.hardware.gpu_count < count:
            return f"needs {count} GPUs, have {ctx.hardware.gpu_count} ({label})"
    if kwargs.get("triton"):
        reason = _triton(ctx)
        if reason is not None:
            return reason
    if kwargs.get("fa2"):
        reason = _fa2(ctx)
        if reason is not None:
            return reason
    wanted = kwargs.get("feature")
    names = (wanted,) if isinstance(wanted, str) else tuple(wanted or ())
    for name in names:
        reason = _feature(ctx, name)
        if reason is not None:
            return reason
    return None


_SIMPLE: Dict[str, Callable[[Context], Optional[str]]] = {"gpu": _gpu, "triton": _triton, "fa2": _fa2}


def skip_reason(marks: Iterable[Tuple[str, Tuple[Any, ...], Mapping[str, Any]]], ctx: Context) -> Optional[str]:
    """The first unmet need among ``marks`` (``(name, args, kwargs)``), or ``None``.

    Raises:
        RequirementError: a ``requires`` marker with positional or unknown arguments,
            or an unknown feature name.
    """
    for name, args, kwargs in marks:
        if name == "requires":
            if args:
                raise RequirementError(f"requires() takes keyword arguments only ({', '.join(REQUIRES_KEYS)})")
            reason = _requires(ctx, kwargs)
        elif name in _SIMPLE:
            reason = _SIMPLE[name](ctx)
        else:
            continue
        if reason is not None:
            return reason
    return None
