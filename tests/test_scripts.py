"""Scripts that edit a copy of the library's source must still find their places in it."""

from __future__ import annotations

import importlib.util
import pathlib
import shutil

SCRIPTS = pathlib.Path(__file__).resolve().parents[1] / "scripts"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_decode_trace_probe_finds_every_stamp_place():
    """``scripts/gpu_decode_trace.py`` inserts its timer stamps at anchors in the decode kernels'
    source (each must occur once, or it stops): a kernel edit that moves one breaks the probe here,
    not on the GPU machine. Every kernel of the copy then takes a ``trace`` argument."""
    probe = _script("gpu_decode_trace")
    tree = probe.instrumented_tree()
    try:
        decode = tree / "nsa" / "ops" / "decode"
        for name in ("compressed_pass.py", "score.py", "selected.py", "combine.py"):
            source = (decode / name).read_text()
            assert " trace,\n):" in source and "trace_stamp(p_tr, 4" in source, name
        assert (decode / "kernel.py").read_text().count("trace=TRACE[") == 4
    finally:
        shutil.rmtree(tree)
