"""Options that every kernel launch of the library passes, whatever the Triton version.

``enable_fp_fusion``: multiplies and adds are fused into FMAs (one rounding instead of two), as
every kernel here was written, tuned and tested with. Triton up to 3.8 fuses unless told otherwise;
3.9 still does, but warns (once a process) when a launch leaves the choice to it, and announces
fusion off as 3.10's default. Left to Triton, the prefill would lose about 2 % on the H100 (session 33: Triton
3.9 with ``TRITON_DEFAULT_FP_FUSION=0``, docs/perf/triton_versions.md). Triton's own
``TRITON_FORCE_DISABLE_FP_FUSION=1`` still turns fusion off for every launch.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

#: Keyword options of every ``kernel[grid](...)`` call in :mod:`nsa.ops` (``**LAUNCH_OPTIONS``).
#: The CPU interpreter ignores them.
LAUNCH_OPTIONS: Mapping[str, bool] = MappingProxyType({"enable_fp_fusion": True})
