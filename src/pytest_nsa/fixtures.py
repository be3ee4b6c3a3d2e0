"""Fixtures: the active profile, its tolerances, and the device tests should use.

Parity and gradcheck tests take their bounds from here, never from literals::

    @pytest.mark.parity
    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_window(nsa_device, nsa_tolerance, dtype):
        q = torch.randn(2, 100, 4, 64, device=nsa_device, dtype=dtype)
        ...
        assert_close("o", out, ref, nsa_tolerance(dtype))
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Dict, Union

import pytest

from pytest_nsa.hardware import HardwareInfo
from pytest_nsa.profiles import Profile
from pytest_nsa.state import get_state

if TYPE_CHECKING:  # torch is imported lazily: the plugin loads for every pytest run
    import torch

    from pytest_nsa.markers import Context


def _context(config: pytest.Config) -> "Context":
    state = get_state(config)
    if not state.engaged:
        raise RuntimeError("pytest_nsa is not engaged in this run: pass --gpu-profile auto (or a profile name, a "
                           "path to one, or none) for its fixtures and markers, e.g. in addopts")
    if state.context is None:
        raise RuntimeError("pytest_nsa is not configured (was the plugin disabled with -p no:nsa?)")
    return state.context


@pytest.fixture(scope="session")
def nsa_profile(pytestconfig: pytest.Config) -> Profile:
    """The active :class:`~pytest_nsa.profiles.Profile` (frozen). Without ``--gpu-profile``,
    the profile matching the device, whose values are used but whose flags are not applied."""
    return _context(pytestconfig).profile


@pytest.fixture(scope="session")
def nsa_hardware(pytestconfig: pytest.Config) -> HardwareInfo:
    """The detected (or conftest-faked) :class:`~pytest_nsa.hardware.HardwareInfo`."""
    return _context(pytestconfig).hardware


@pytest.fixture(scope="session")
def nsa_device(pytestconfig: pytest.Config) -> "torch.device":
    """``torch.device("cuda")`` when a GPU is visible, usable by torch and used by the
    profile (not a CPU profile, not a mismatch); ``torch.device("cpu")`` otherwise."""
    ctx = _context(pytestconfig)
    import torch

    return torch.device("cuda" if ctx.uses_gpu and torch.cuda.is_available() else "cpu")


def _dtype_name(dtype: "Union[torch.dtype, str]") -> str:
    return dtype if isinstance(dtype, str) else str(dtype).replace("torch.", "")


@pytest.fixture(scope="session")
def nsa_tolerance(nsa_profile: Profile) -> Callable[..., float]:
    """``nsa_tolerance(dtype, kind="fwd") -> float``: the profile's RMS-relative error bound
    (for ``nsa.testing.assert_close``) for ``dtype`` (float64/float32/float16/bfloat16, a
    ``torch.dtype`` or its name) and ``kind`` (``"fwd"`` or ``"grad"``)."""

    def tolerance(dtype: "Union[torch.dtype, str]", kind: str = "fwd") -> float:
        return nsa_profile.tolerance(_dtype_name(dtype), kind)

    return tolerance


@pytest.fixture
def nsa_gradcheck_tolerance(nsa_profile: Profile) -> Dict[str, float]:
    """``{"eps", "atol", "rtol"}`` for ``torch.autograd.gradcheck(fn, inputs, **tol)`` (a fresh dict)."""
    return dict(nsa_profile.gradcheck)
