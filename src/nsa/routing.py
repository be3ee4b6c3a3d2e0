"""Routing: which backend runs each op, and why.

Every public op asks :func:`resolve` for a :class:`Route` (backend + reason)
before it runs. The decision, in order of precedence:

1. ``backend=`` passed to the op (anything but ``"auto"``);
2. the op's flag ``NSA_BACKEND_<OP>``, then ``NSA_BACKEND`` (see :mod:`nsa.flags`);
3. ``auto``: Triton on a CUDA device of SM >= 8.0 when the op has a Triton
   kernel and the dtype is float16/bfloat16/float32 (float32 only for heads whose tiles fit
   the GPU's shared memory: up to 128 wide below Hopper); the reference otherwise.

An explicit choice (1 or 2) that cannot run here raises
:class:`BackendUnavailableError` with the reason: asking for Triton and silently
getting the reference would make every parity test meaningless. The automatic
choice never fails; it falls back to the reference and says why.

Kernels never read flags: the router is the only place that turns flags into
decisions. ``python -m nsa.routing [--device cuda] [--dtype bfloat16]`` prints
the decision for every op.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional, Sequence, Set, Tuple, Union

import torch

from nsa import flags

log = logging.getLogger("nsa.routing")

TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MIN_CUDA_CAPABILITY = (8, 0)
#: The oldest Triton whose CPU interpreter runs the kernels: 3.6's stops at loops whose bounds
#: are tensors ("only 0-dimensional arrays can be converted to Python scalars"); 3.7.1, 3.8.0
#: and 3.9.0 ran the whole CPU test suite (session 32).
INTERPRETER_MIN_TRITON = (3, 7)
#: What to do about :func:`interpreter_problem`.
INTERPRETER_FIX = "pip install 'triton>={}.{}'".format(*INTERPRETER_MIN_TRITON)
#: Why no op can take Triton where it cannot be imported (it is the optional ``triton`` extra).
TRITON_MISSING = "triton is not installed (pip install 'nsa[triton]')"

DeviceLike = Union[torch.device, str]


class BackendUnavailableError(RuntimeError):
    """A backend was asked for explicitly (argument or flag) but cannot run here."""


@dataclass(frozen=True)
class Route:
    """The outcome of routing one op: ``backend`` is ``"reference"`` or ``"triton"``."""

    op: str
    backend: str
    reason: str


@lru_cache(maxsize=None)
def has_kernel(op: str) -> bool:
    """Whether ``nsa.ops.<op>.kernel`` exists (found without importing it or Triton)."""
    try:
        return importlib.util.find_spec(f"nsa.ops.{op}.kernel") is not None
    except ModuleNotFoundError:
        return False


@lru_cache(maxsize=None)
def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


@lru_cache(maxsize=None)
def triton_version() -> str:
    import triton

    return triton.__version__


def interpreter_problem(version: str) -> Optional[str]:
    """Why the CPU interpreter of Triton ``version`` cannot run the kernels (the fix:
    :data:`INTERPRETER_FIX`); None when it can, or when the version cannot be read."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None or (int(match.group(1)), int(match.group(2))) >= INTERPRETER_MIN_TRITON:
        return None
    return f"triton {version}'s CPU interpreter cannot run nsa's kernels (it rejects tensor loop bounds)"


def triton_interpreter_on() -> bool:
    """Whether Triton's own ``TRITON_INTERPRET`` switch is on (Triton reads it when a
    kernel is defined, so it must be set before the kernel modules are imported)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in {"1", "true", "yes", "on"}


#: The widths of an op's heads, as routing takes them: ``(Dk, Dv)``, or one width for both (or
#: for the wider, where only that is known), or None where the op's tiles do not depend on them.
HeadDims = Optional[Union[int, Tuple[int, int]]]


def _head_widths(head_dim: HeadDims) -> Optional[Tuple[int, int]]:
    """``(Dk, Dv)`` of :data:`HeadDims`: one width stands for both."""
    if head_dim is None:
        return None
    return (head_dim, head_dim) if isinstance(head_dim, int) else (int(head_dim[0]), int(head_dim[1]))


def triton_status(op: str, device: DeviceLike, dtype: torch.dtype,
                  head_dim: HeadDims = None) -> Tuple[bool, str]:
    """``(ok, reason)``: can the Triton kernel of ``op`` run on ``device`` with ``dtype``, for
    heads ``head_dim`` wide (``(Dk, Dv)``, or one width for both; None: not asked)?"""
    widths = _head_widths(head_dim)
    device = torch.device(device)
    if not has_kernel(op):
        return False, f"no Triton kernel for '{op}' yet"
    if not triton_installed():
        return False, TRITON_MISSING
    if dtype not in TRITON_DTYPES:
        return False, f"Triton kernels take float16/bfloat16/float32, not {str(dtype).replace('torch.', '')}"
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return False, "CUDA is not available"
        cap = torch.cuda.get_device_capability(device)
        if cap < MIN_CUDA_CAPABILITY:
            return False, f"needs SM >= {MIN_CUDA_CAPABILITY[0]}.{MIN_CUDA_CAPABILITY[1]}, have {cap[0]}.{cap[1]}"
        if dtype == torch.float32 and widths is not None:
            from nsa.ops._triton.device import float32_head_dim_limit, shared_memory_per_program

            limit = float32_head_dim_limit(device)
            if limit is not None and max(widths) > limit:
                return False, (
                    f"float32 tiles of heads {max(widths)} wide ask more shared memory than this GPU's "
                    f"{shared_memory_per_program(device) // 1024} KiB a program (heads up to {limit} fit; "
                    f"docs/perf/float32.md); use bfloat16/float16 inputs"
                )
        if widths is not None:
            from nsa.ops._triton.device import WIDE_HEAD_OPS, WIDEST_HEADS, heads_fit, shared_memory_per_program

            if op in WIDE_HEAD_OPS and not heads_fit(*widths, device):
                return False, (
                    f"tiles of key and value heads {widths[0]}/{widths[1]} wide ask more shared memory than "
                    f"this GPU's {shared_memory_per_program(device) // 1024} KiB a program in the {op} kernels "
                    f"(heads up to {WIDEST_HEADS} fit, and on GPUs under 128 KiB one of the two at most 128 wide, "
                    f"as 192/128; docs/perf/other_gpus.md)"
                )
        return True, f"Triton kernel on SM {cap[0]}.{cap[1]}"
    if device.type == "cpu":
        if triton_interpreter_on():
            problem = interpreter_problem(triton_version())
            if problem is not None:
                return False, f"{problem}; {INTERPRETER_FIX}"
            return True, "Triton kernel through the interpreter (TRITON_INTERPRET=1)"
        return False, "tensors on CPU: Triton runs there only under TRITON_INTERPRET=1"
    return False, f"device type '{device.type}' has no Triton backend here"


_logged: Set[Route] = set()


def _log_once(route: Route) -> Route:
    if route not in _logged and flags.get("NSA_LOG_ROUTING"):
        _logged.add(route)
        log.info("nsa route %s -> %s (%s)", route.op, route.backend, route.reason)
    return route


def resolve(op: str, device: DeviceLike, dtype: torch.dtype, backend: Optional[str] = None,
            head_dim: HeadDims = None) -> Route:
    """Decide the backend of ``op`` for tensors on ``device`` of ``dtype``.

    Args:
        op: one of :data:`nsa.flags.OPS`.
        backend: ``None``/``"auto"`` to let flags and the device decide, or
            ``"reference"``/``"triton"`` to insist.
        head_dim: the op's key and value head widths ``(Dk, Dv)`` (or one width for both),
            where its tiles depend on them: float32 tiles of wide heads, the window's and the
            compressed branch's tiles of heads wider than 256, and on consumer GPUs theirs where
            both are wider than 128, do not fit the GPU's shared memory.

    Raises:
        ValueError: unknown ``op`` or ``backend``.
        BackendUnavailableError: an explicitly requested backend cannot run here.
    """
    if op not in flags.OPS:
        raise ValueError(f"unknown op {op!r}; ops are {', '.join(flags.OPS)}")
    if backend is not None and backend not in flags.BACKEND_CHOICES:
        raise ValueError(f"backend must be one of {', '.join(flags.BACKEND_CHOICES)}, got {backend!r}")

    source = "argument backend="
    choice = backend or "auto"
    if choice == "auto":
        for name in (f"NSA_BACKEND_{op.upper()}", "NSA_BACKEND"):
            value = flags.get(name)
            if value != "auto":
                choice, source = value, f"flag {name}"
                break

    if choice == "reference":
        return _log_once(Route(op, "reference", f"requested by {source}"))
    ok, why = triton_status(op, device, dtype, head_dim)
    if choice == "triton":
        if not ok:
            raise BackendUnavailableError(f"'{op}': triton requested by {source} but unavailable: {why}")
        return _log_once(Route(op, "triton", f"requested by {source}; {why}"))
    if ok and torch.device(device).type == "cuda":
        return _log_once(Route(op, "triton", f"auto: {why}"))
    if ok:
        why = "auto keeps CPU tensors on the reference (the interpreter is for tests)"
    return _log_once(Route(op, "reference", f"auto: {why}"))


def all_triton(ops: Sequence[str], device: DeviceLike, dtype: torch.dtype, backend: Optional[str] = None,
               head_dim: HeadDims = None) -> bool:
    """Whether every op of ``ops`` routes to its Triton kernel (a launch fusing several needs all)."""
    return all(resolve(op, device, dtype, backend, head_dim).backend == "triton" for op in ops)


def explain(device: DeviceLike, dtype: torch.dtype, head_dim: HeadDims = None) -> str:
    """A table of every op's route for ``device``/``dtype`` and heads ``head_dim`` wide (errors
    shown, not raised)."""
    width = "" if head_dim is None else f" head_dim={head_dim if isinstance(head_dim, int) else '%d:%d' % tuple(head_dim)}"
    lines = [f"nsa routing for device={torch.device(device)} dtype={str(dtype).replace('torch.', '')}{width}"]
    for op in flags.OPS:
        try:
            route = resolve(op, device, dtype, head_dim=head_dim)
            lines.append(f"  {op:<11} {route.backend:<10} {route.reason}")
        except (BackendUnavailableError, flags.FlagError) as err:
            lines.append(f"  {op:<11} {'ERROR':<10} {err}")
    overrides = {k: v for k, (v, src) in flags.current().items() if src == "environment"}
    lines.append("flags set: " + (", ".join(f"{k}={v}" for k, v in overrides.items()) or "none"))
    for key, best in flags.unknown_flags():
        lines.append(f"warning: unknown {key} is ignored" + (f" (did you mean {best}?)" if best else ""))
    return "\n".join(lines)


def _head_dims_arg(text: str) -> Union[int, Tuple[int, int]]:
    """``--head-dim``: ``D`` (both heads) or ``DK:DV``."""
    parts = text.split(":")
    if len(parts) > 2 or not all(part.isdigit() for part in parts):
        raise argparse.ArgumentTypeError(f"expected D or DK:DV (e.g. 128 or 192:128), got {text!r}")
    return int(parts[0]) if len(parts) == 1 else (int(parts[0]), int(parts[1]))


def _main(argv: Optional[list] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m nsa.routing", description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16", "float32", "float64"])
    parser.add_argument("--head-dim", type=_head_dims_arg, default=None, metavar="D|DK:DV",
                        help="the key and value heads' widths, or one for both (float32 routes, and 16-bit "
                             "ones on GPUs with less shared memory, depend on them)")
    args = parser.parse_args(argv)
    print(explain(args.device, getattr(torch, args.dtype), args.head_dim))


if __name__ == "__main__":
    _main()
