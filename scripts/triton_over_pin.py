"""A pytest plugin for one kind of experiment: the GPU tests under a Triton other than the one
the installed torch pins (``-p triton_over_pin``, with ``scripts/`` on the path).

pytest_nsa refuses to run when the installed Triton is not the one torch pins (torch's own
compiler would break), which is right for users. To learn how the kernels fare under the Triton
of a newer torch on a machine that has an older torch only (the GPU machine has torch 2.11 and no
way to install torch 2.14), the session scripts put that Triton first on the path and load this
plugin: it reports the real versions, with torch's pin replaced by the installed Triton and the
replacement written into the software's ``source``, which the report and the header show.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import pytest

from pytest_nsa.versions import SoftwareInfo, detect


@pytest.hookimpl(tryfirst=True)
def pytest_nsa_detect_software(config: pytest.Config) -> Optional[SoftwareInfo]:
    real = detect()
    if real.triton is None or real.torch_triton_pin is None:
        return None
    return replace(real, torch_triton_pin=f"triton=={real.triton}",
                   source=f"torch pins {real.torch_triton_pin}; triton {real.triton} run in its place "
                          "by scripts/triton_over_pin.py")
