"""Every kernel launch passes the library's launch options (:mod:`nsa.ops._triton.launch`).

``enable_fp_fusion=True`` keeps the kernels compiled as they were tuned whatever Triton's default
(3.9 warns when a launch leaves it unset; 3.10 turns it off); the decode score launch alone passes
``UNFUSED_LAUNCH_OPTIONS`` (fusion off: it ranks keys against their copies in other lanes). Two
checks: each ``*_kernel[grid](...)`` call in the source (or ``launch_within_shared_memory``, which
makes it) passes one of the two and each kernel has
such a call (so a new kernel or launch site cannot miss it), and a prefill's forward and backward
and a decode step, run for real, hand the option to Triton at every launch.
"""

from __future__ import annotations

import ast
import pathlib
from typing import Dict, List

import pytest

from nsa.ops._triton.launch import LAUNCH_OPTIONS, UNFUSED_LAUNCH_OPTIONS
from nsa.routing import TRITON_MISSING

from _kernel_inputs import prefill_and_decode_launches

SOURCE = pathlib.Path(__file__).resolve().parents[2] / "src" / "nsa"


def _kernel_name(node: ast.expr) -> str:
    return getattr(node, "id", None) or getattr(node, "attr", "")


# the kernels whose launches pass UNFUSED_LAUNCH_OPTIONS
UNFUSED = {"decode_score_kernel"}


def _launched_kernel(node: ast.AST) -> str:
    """The kernel a call launches: ``name_kernel[grid](...)``, or
    ``launch_within_shared_memory(name_kernel, grid, ...)`` (which makes that call); else ``""``."""
    if not isinstance(node, ast.Call):
        return ""
    if isinstance(node.func, ast.Subscript) and _kernel_name(node.func.value).endswith("_kernel"):
        return _kernel_name(node.func.value)
    if _kernel_name(node.func) == "launch_within_shared_memory" and node.args and \
            _kernel_name(node.args[0]).endswith("_kernel"):
        return _kernel_name(node.args[0])
    return ""


def _source_kernels() -> Dict[str, List[str]]:
    """``{"defined": [...], "launched": [...], "missing_options": [...], "unfused": [...]}`` over
    ``src/nsa``: the ``@triton.jit`` functions named ``*_kernel``, the ``*_kernel[grid](...)`` calls,
    those calls (``path:line``) without ``**LAUNCH_OPTIONS`` or ``**UNFUSED_LAUNCH_OPTIONS``, and
    the kernels launched with the latter."""
    found: Dict[str, List[str]] = {"defined": [], "launched": [], "missing_options": [], "unfused": []}
    for path in sorted(SOURCE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef) and node.name.endswith("_kernel") and any(
                    _kernel_name(getattr(d, "func", d)) == "jit" for d in node.decorator_list):
                found["defined"].append(node.name)
            kernel = _launched_kernel(node)
            if kernel:
                found["launched"].append(kernel)
                options = [_kernel_name(kw.value) for kw in node.keywords if kw.arg is None]
                if "UNFUSED_LAUNCH_OPTIONS" in options:
                    found["unfused"].append(kernel)
                elif "LAUNCH_OPTIONS" not in options:
                    found["missing_options"].append(f"{path.relative_to(SOURCE)}:{node.lineno}")
    return found


def test_every_launch_site_passes_the_launch_options():
    found = _source_kernels()
    assert len(found["defined"]) >= 20, found  # the scan sees the kernels
    assert sorted(set(found["defined"])) == sorted(set(found["launched"])), "a kernel without a launch site here"
    assert found["missing_options"] == [], "launches without **LAUNCH_OPTIONS"
    assert set(found["unfused"]) == UNFUSED


def test_launch_options_keep_fp_fusion_on():
    assert dict(LAUNCH_OPTIONS) == {"enable_fp_fusion": True}
    assert dict(UNFUSED_LAUNCH_OPTIONS) == {"enable_fp_fusion": False}
    with pytest.raises(TypeError):
        LAUNCH_OPTIONS["enable_fp_fusion"] = False  # type: ignore[index]


@pytest.mark.triton
def test_every_launch_hands_fp_fusion_to_triton(nsa_device):
    """A real prefill (forward and backward) and decode step: every launch carries
    ``enable_fp_fusion``, ``True`` but for the decode score launch, and most of the library's
    kernels were launched."""
    launches = prefill_and_decode_launches(nsa_device, 16, 16)
    kernels = {name for name, _ in launches}
    assert len(kernels) >= 12, kernels
    assert UNFUSED <= kernels
    assert [name for name, kwargs in launches if kwargs.get("enable_fp_fusion") is not (name not in UNFUSED)] == []


def test_launch_sizes_are_host_arithmetic_equal_to_tritons():
    """Launch wrappers size grids and tiles with :func:`cdiv` and :func:`next_power_of_2` of
    :mod:`nsa.ops._triton.launch`: the same values as Triton's helpers, which are constexpr
    functions and cost about a hundred times more from the host. No source calls Triton's from
    the host (kernels have ``tl.cdiv``)."""
    triton = pytest.importorskip("triton", reason=TRITON_MISSING)

    from nsa.ops._triton.launch import cdiv, next_power_of_2

    for a in range(0, 300):
        assert next_power_of_2(a) == triton.next_power_of_2(a), a
        for b in (1, 2, 3, 16, 64, 129):
            assert cdiv(a, b) == triton.cdiv(a, b), (a, b)
    assert next_power_of_2(2**40 + 1) == 2**41
    called = [
        f"{path.relative_to(SOURCE)}:{node.lineno}"
        for path in sorted(SOURCE.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and getattr(node.func.value, "id", None) == "triton" and node.func.attr in ("cdiv", "next_power_of_2")
    ]  # fmt: skip
    assert not called, called
