"""Hooks that pytest_nsa calls, for conftests and plugins to implement.

Both are ``firstresult``: the first implementation that returns something other
than ``None`` wins, and the plugin's own (real detection) runs last.

When they are called: once early, before conftests load (so the profile's flags
are in the environment before torch, triton or nsa are imported by test code),
and again in ``pytest_configure``, when conftests are loaded. Only plugins named
with ``-p`` or installed as entry points answer the early call; a conftest's
answer counts from the second call on, and when it changes the outcome the
plugin re-selects the profile and re-applies its flags.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import pytest

if TYPE_CHECKING:
    from pytest_nsa.hardware import HardwareInfo
    from pytest_nsa.versions import SoftwareInfo


@pytest.hookspec(firstresult=True)
def pytest_nsa_detect_hardware(config: pytest.Config) -> Optional["HardwareInfo"]:
    """Return the hardware the tests should assume, or ``None`` to let the next
    implementation (finally the real detector, :func:`pytest_nsa.hardware.detect`) answer.

    The documented way to fake a device, e.g. to test profile selection or skip
    reasons on a machine without that GPU. In a ``conftest.py``::

        from pytest_nsa.hardware import GPUInfo, HardwareInfo

        def pytest_nsa_detect_hardware(config):
            rtx4090 = GPUInfo(index=0, name="NVIDIA GeForce RTX 4090", capability=(8, 9), memory_gib=23.6)
            return HardwareInfo(gpus=(rtx4090,), driver="550.54", cuda="12.4", source="faked by conftest")

    A fake changes what the plugin decides (profile, skips, reports); it does not
    make ``torch.cuda`` see a device, so faked GPU tests still run on the CPU
    (``nsa_device`` follows ``torch.cuda.is_available()``).
    """


@pytest.hookspec(firstresult=True)
def pytest_nsa_detect_software(config: pytest.Config) -> Optional["SoftwareInfo"]:
    """Return the software versions to assume, or ``None`` for the real ones
    (:func:`pytest_nsa.versions.detect`, from package metadata). For example, to
    check how a bad torch/triton pairing is reported::

        from pytest_nsa.versions import SoftwareInfo

        def pytest_nsa_detect_software(config):
            return SoftwareInfo(python="3.11.7", torch="2.4.1+cu121", triton="3.1.0",
                                torch_triton_pin="triton==3.0.0", source="faked by conftest")
    """
