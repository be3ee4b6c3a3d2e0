"""What hardware the tests run on: GPUs, driver and CUDA, as torch sees them.

No pytest import here (unit-testable). :func:`detect` is the real detector; the
plugin calls it through the ``pytest_nsa_detect_hardware`` hook, which a conftest
may implement to return a made-up :class:`HardwareInfo` instead (see
``hookspecs.py``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple

#: Linux exposes the kernel module's version here; cheaper than running nvidia-smi.
_DRIVER_FILE = Path("/proc/driver/nvidia/version")
_DRIVER_RE = re.compile(r"Kernel Module\s+(?:for\s+\S+\s+)?([0-9][0-9.]+)")


@dataclass(frozen=True)
class GPUInfo:
    """One visible CUDA device.

    Attributes:
        index: torch's device index (after ``CUDA_VISIBLE_DEVICES``).
        name: e.g. ``"NVIDIA GeForce RTX 4090"``.
        capability: compute capability, e.g. ``(8, 9)``.
        memory_gib: total memory in GiB (2**30 bytes), e.g. ``23.6``.
    """

    index: int
    name: str
    capability: Tuple[int, int]
    memory_gib: float

    @property
    def sm(self) -> str:
        """The compute capability as text, e.g. ``"8.9"``."""
        return f"{self.capability[0]}.{self.capability[1]}"

    def describe(self) -> str:
        return f"{self.name} (SM {self.sm}, {self.memory_gib:.1f} GiB)"


@dataclass(frozen=True)
class HardwareInfo:
    """The machine as the tests see it.

    Attributes:
        gpus: visible CUDA devices, index order; empty on a CPU-only machine.
        driver: NVIDIA driver version, ``None`` when unknown.
        cuda: CUDA runtime version torch was built with (``torch.version.cuda``),
            ``None`` for a CPU build.
        visible_devices: ``CUDA_VISIBLE_DEVICES`` at detection, ``None`` if unset.
        source: who produced this record (``"detected"``, or a note from a fake).
    """

    gpus: Tuple[GPUInfo, ...] = ()
    driver: Optional[str] = None
    cuda: Optional[str] = None
    visible_devices: Optional[str] = None
    source: str = "detected"

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    @property
    def primary(self) -> Optional[GPUInfo]:
        """The device tests use (index 0), or ``None`` without a GPU."""
        return self.gpus[0] if self.gpus else None

    def describe(self) -> str:
        """One line: device, count, driver, CUDA and where the record came from."""
        if not self.gpus:
            text = "no CUDA GPU"
        else:
            text = self.gpus[0].describe()
            names = {g.name for g in self.gpus}
            if len(self.gpus) > 1:
                text += f" x{len(self.gpus)}" + ("" if len(names) == 1 else f" (mixed: {', '.join(sorted(names))})")
        text += f", driver {self.driver or 'n/a'}, CUDA {self.cuda or 'n/a'}"
        if self.visible_devices is not None:
            text += f", CUDA_VISIBLE_DEVICES={self.visible_devices}"
        if self.source != "detected":
            text += f" [{self.source}]"
        return text


def driver_version(path: Path = _DRIVER_FILE) -> Optional[str]:
    """The NVIDIA kernel-module version from ``/proc``, or ``None`` when absent."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    match = _DRIVER_RE.search(text)
    return match.group(1) if match else None


def detect() -> HardwareInfo:
    """Ask torch which CUDA devices are visible (initialises CUDA when present).

    Call it only after ``CUDA_VISIBLE_DEVICES`` is final: the CUDA runtime reads
    that variable once, when it first starts.
    """
    import torch  # deferred: importing torch costs seconds and the plugin loads for every pytest run

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not torch.cuda.is_available():
        return HardwareInfo(cuda=torch.version.cuda, visible_devices=visible, driver=driver_version())
    gpus = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        gpus.append(GPUInfo(index, props.name, (props.major, props.minor), props.total_memory / 2**30))
    return HardwareInfo(tuple(gpus), driver_version(), torch.version.cuda, visible)
