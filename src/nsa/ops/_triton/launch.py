"""Options that every kernel launch of the library passes, whatever the Triton version.

``enable_fp_fusion``: multiplies and adds are fused into FMAs (one rounding instead of two), as
every kernel here was written, tuned and tested with. Triton up to 3.8 fuses unless told otherwise;
3.9 still does, but warns (once a process) when a launch leaves the choice to it, and announces
fusion off as 3.10's default. Left to Triton, the prefill would lose about 2 % on the H100 (session 33: Triton
3.9 with ``TRITON_DEFAULT_FP_FUSION=0``, docs/perf/triton_versions.md). Triton's own
``TRITON_FORCE_DISABLE_FP_FUSION=1`` still turns fusion off for every launch.

``UNFUSED_LAUNCH_OPTIONS``: fusion off, for a kernel that compares a value summed across lanes with
itself. A butterfly reduction leaves the sum in every lane of the group; fused, each lane adds its
partner's rounded product to its own unrounded one, so the lanes' copies of one sum can differ in
the last bit. The decode score launch ranks each block's key against all of its tile's keys, copies
that come from different lanes: fused, a key could outrank itself (at batch 16, 64k on an H200, 6
of 6144 score tiles of three steps lost a candidate, session 43).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

#: Keyword options of every ``kernel[grid](...)`` call in :mod:`nsa.ops` (``**LAUNCH_OPTIONS``).
#: The CPU interpreter ignores them.
LAUNCH_OPTIONS: Mapping[str, bool] = MappingProxyType({"enable_fp_fusion": True})
#: The same with fusion off, where a kernel's sums must be equal in every lane (see above).
UNFUSED_LAUNCH_OPTIONS: Mapping[str, bool] = MappingProxyType({"enable_fp_fusion": False})


# Host-side sizes of launches. Triton's ``cdiv`` and ``next_power_of_2`` are constexpr functions,
# meant for kernels: called from the host, each unwraps its arguments first, 3 us a call on a
# desktop CPU against 0.03 for the arithmetic; one training step of a layer made about 80 such
# calls (docs/perf/compile.md, session 37).


def pdl_launch(on: bool) -> Mapping[str, bool]:
    """The launch options of programmatic dependent launch: ``launch_pdl`` only when ``on``, since
    the interpreter knows neither it nor ``gdc_wait``."""
    return {"launch_pdl": True} if on else {}


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive ``b``, on the host."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of 2 that is at least ``n`` (0 for 0, as Triton's), on the host."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


#: Launches that did not fit, by launch (:func:`launch_within_shared_memory`): how many times its
#: ``smaller`` made the launch smaller before it fit. Later launches start from there, without
#: compiling or failing again.
_FITTED_SHRINKS: Dict[Tuple[Any, ...], int] = {}


def fewer_stages(options: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
    """The launch ``options`` with one pipeline stage fewer; None at one stage (or none named)."""
    stages = options.get("num_stages")
    return dict(options, num_stages=stages - 1) if stages is not None and stages > 1 else None


def launch_within_shared_memory(kernel, grid, what: str, *args,
                                smaller: Callable[[Mapping[str, Any]], Optional[Dict[str, Any]]] = fewer_stages,
                                **kwargs) -> None:
    """``kernel[grid](*args, **kwargs)``, made smaller by ``smaller`` (by default
    :func:`fewer_stages`) each time the GPU's shared memory a program cannot hold the compiled
    launch (Triton's ``OutOfResources``, raised as it loads the kernel, before anything runs),
    until ``smaller`` has nothing smaller to offer.

    The tuned launches fit every shipped GPU at the shapes measured; this is for the rest of the
    space, which the fuzzer found to pass it: a selection block of 128 keys with 192-wide heads
    asked 261-288 KiB of an H200's 227 in two stages (session 79). Where the smallest launch does
    not fit either, a :class:`nsa.routing.BackendUnavailableError` says so for ``what`` (the op's
    kernel)."""
    try:
        from triton.runtime.errors import OutOfResources
    except ImportError:  # a Triton without it raises nothing of the kind
        OutOfResources = ()  # noqa: N806
    key = None
    if _FITTED_SHRINKS:  # the launch's key only once some launch has not fit: none in the tuned space
        key = _launch_key(kernel, args, kwargs)
        for _ in range(_FITTED_SHRINKS.get(key, 0)):
            kwargs = smaller(kwargs)
    tried = kwargs
    while True:
        try:
            kernel[grid](*args, **tried)
            return
        except OutOfResources as err:
            if "shared memory" not in str(err):
                raise
            tried = smaller(tried)
            if tried is None:
                from nsa.routing import BackendUnavailableError

                raise BackendUnavailableError(
                    f"{what}: its Triton kernel does not fit this GPU's shared memory a program even in its "
                    f"smallest launch ({err}); narrower heads, a shorter sel_block, 16-bit inputs (for float32) "
                    f"or backend='reference' run") from None
            key = key or _launch_key(kernel, args, kwargs)
            _FITTED_SHRINKS[key] = _FITTED_SHRINKS.get(key, 0) + 1


def _launch_key(kernel, args: Tuple[Any, ...], kwargs: Mapping[str, Any]) -> Tuple[Any, ...]:
    """What decides a launch's shared memory: the kernel, its scalar and constexpr arguments (the
    tiles and stages asked for among them) and its tensors' dtypes."""
    return (kernel, *sorted((name, value) for name, value in kwargs.items() if isinstance(value, (bool, int, float, str))),
            *(str(a.dtype) for a in args if hasattr(a, "dtype")))
