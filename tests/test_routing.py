"""Routing: which backend runs each op and why; precedence argument > op flag > NSA_BACKEND > auto.

CUDA and Triton availability are monkeypatched, so every branch of the decision is
exercised on a CPU-only machine without running a kernel.
"""

from __future__ import annotations

import logging
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch

import nsa
from nsa import flags, ops, routing
from nsa.routing import BackendUnavailableError, resolve

OPS_DIR = pathlib.Path(routing.__file__).parent / "ops"


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    """No NSA_* flag and no interpreter unless a test sets them; routing logs afresh."""
    for key in [k for k in os.environ if k.startswith(flags.PREFIX)]:
        monkeypatch.delenv(key)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(routing, "_logged", set())


@pytest.fixture
def triton_on_cpu(monkeypatch):
    """Every op has a kernel and the interpreter is on: Triton can run on CPU tensors."""
    monkeypatch.setattr(routing, "has_kernel", lambda op: True)
    monkeypatch.setattr(routing, "triton_installed", lambda: True)
    monkeypatch.setattr(routing, "triton_version", lambda: "3.9.0")
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture
def gpu(monkeypatch):
    """A fake CUDA device of a chosen capability (default SM 9.0), every op with a kernel."""
    cap = [(9, 0)]
    monkeypatch.setattr(routing, "has_kernel", lambda op: True)
    monkeypatch.setattr(routing, "triton_installed", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cap[0])
    return cap


def test_has_kernel_matches_the_files():
    for op in flags.OPS:
        assert routing.has_kernel(op) == (OPS_DIR / op / "kernel.py").is_file(), op


def test_unknown_op_or_backend():
    with pytest.raises(ValueError, match=r"unknown op 'attention'; ops are compress, compressed, select"):
        resolve("attention", "cpu", torch.float32)
    with pytest.raises(ValueError, match=r"backend must be one of auto, reference, triton, got 'cuda'"):
        resolve("window", "cpu", torch.float32, backend="cuda")


# ---------------------------------------------------------------- precedence


def test_auto_keeps_cpu_tensors_on_the_reference(triton_on_cpu):
    route = resolve("window", "cpu", torch.float32)
    assert (route.backend, route.op) == ("reference", "window")
    assert "auto keeps CPU tensors on the reference" in route.reason


def test_flags_then_argument(triton_on_cpu, monkeypatch):
    monkeypatch.setenv("NSA_BACKEND", "triton")
    assert resolve("compress", "cpu", torch.float32) == routing.Route(
        "compress", "triton", "requested by flag NSA_BACKEND; Triton kernel through the interpreter (TRITON_INTERPRET=1)"
    )
    monkeypatch.setenv("NSA_BACKEND_WINDOW", "reference")  # the op's flag beats NSA_BACKEND
    route = resolve("window", "cpu", torch.float32)
    assert route.backend == "reference" and route.reason == "requested by flag NSA_BACKEND_WINDOW"
    assert resolve("select", "cpu", torch.float32).backend == "triton"  # other ops still follow NSA_BACKEND
    route = resolve("window", "cpu", torch.float32, backend="triton")  # the argument beats both flags
    assert route.backend == "triton" and route.reason.startswith("requested by argument backend=")
    monkeypatch.setenv("NSA_BACKEND_WINDOW", "auto")  # 'auto' defers to NSA_BACKEND
    assert resolve("window", "cpu", torch.float32, backend="auto").reason.startswith("requested by flag NSA_BACKEND;")


def test_explicit_triton_that_cannot_run_raises(monkeypatch):
    monkeypatch.setattr(routing, "has_kernel", lambda op: True)
    monkeypatch.setattr(routing, "triton_installed", lambda: True)
    with pytest.raises(BackendUnavailableError, match=(
        r"'window': triton requested by argument backend= but unavailable: tensors on CPU: "
        r"Triton runs there only under TRITON_INTERPRET=1"
    )):
        resolve("window", "cpu", torch.float32, backend="triton")
    monkeypatch.setenv("NSA_BACKEND_SELECTED", "triton")
    with pytest.raises(BackendUnavailableError, match=r"'selected': triton requested by flag NSA_BACKEND_SELECTED"):
        resolve("selected", "cpu", torch.float32)
    assert resolve("selected", "cpu", torch.float32, backend="reference").backend == "reference"


@pytest.mark.parametrize(
    "patch, device, dtype, reason",
    [
        ("no-kernel", "cpu", torch.float32, "no Triton kernel for 'window' yet"),
        ("no-triton", "cpu", torch.float32, "triton is not installed (pip install 'nsa[triton]')"),
        ("kernel", "cpu", torch.float64, "Triton kernels take float16/bfloat16/float32, not float64"),
        ("kernel", "meta", torch.float32, "device type 'meta' has no Triton backend here"),
        ("kernel", "cuda", torch.bfloat16, "CUDA is not available"),
    ],
    ids=["no-kernel", "no-triton", "float64", "meta", "no-cuda"],
)
def test_auto_falls_back_and_says_why(monkeypatch, patch, device, dtype, reason):
    monkeypatch.setattr(routing, "has_kernel", lambda op: patch != "no-kernel")
    monkeypatch.setattr(routing, "triton_installed", lambda: patch != "no-triton")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    route = resolve("window", device, dtype)
    assert route.backend == "reference" and route.reason == f"auto: {reason}"
    with pytest.raises(BackendUnavailableError, match=re.escape(reason)):
        resolve("window", device, dtype, backend="triton")


@pytest.mark.parametrize("version, runs", [("3.6.0", False), ("3.5.1+git9f2c", False), ("3.7.1", True),
                                           ("3.10.0", True), ("4.0.0", True), ("unknown", True)])
def test_the_interpreter_needs_triton_3_7(triton_on_cpu, monkeypatch, version, runs):
    """Triton 3.6's interpreter stops at the kernels' tensor loop bounds: asking for Triton on CPU
    tensors then raises with the fix (auto keeps them on the reference anyway)."""
    monkeypatch.setattr(routing, "triton_version", lambda: version)
    if runs:
        assert resolve("window", "cpu", torch.float32, backend="triton").backend == "triton"
        return
    why = (f"triton {version}'s CPU interpreter cannot run nsa's kernels (it rejects tensor loop bounds); "
           "pip install 'triton>=3.7'")
    with pytest.raises(BackendUnavailableError, match=re.escape(why)):
        resolve("window", "cpu", torch.float32, backend="triton")
    assert resolve("window", "cpu", torch.float32).backend == "reference"


def test_cuda_capability(gpu):
    route = resolve("compressed", "cuda", torch.bfloat16)
    assert route.backend == "triton" and route.reason == "auto: Triton kernel on SM 9.0"
    assert resolve("compressed", "cuda:0", torch.float64).backend == "reference"
    gpu[0] = (7, 5)
    route = resolve("compressed", "cuda", torch.float16)
    assert route.backend == "reference" and route.reason == "auto: needs SM >= 8.0, have 7.5"


@pytest.mark.parametrize("gpu_name, cap, fits, too_wide", [
    ("rtx4090", (8, 9), 128, 129), ("rtx3090", (8, 6), 128, 192), ("a100", (8, 0), 128, 192), ("h100", (9, 0), 256, None),
])
def test_float32_routes_by_head_width_and_shared_memory(gpu, gpu_name, cap, fits, too_wide):
    """float32 tiles of wide heads ask more shared memory than GPUs below Hopper have (compiled at
    exact float32's own tiles: heads of 128 at most 84 KiB, heads of 192 up to 164 KiB, past an
    A100's 163). Those calls take the reference, with the reason; an explicit Triton request raises
    it. Narrower heads, 16-bit inputs and calls that do not say their width keep Triton."""
    from nsa.ops._triton.device import sized_as

    gpu[0] = cap
    with sized_as(gpu_name) as facts:
        assert resolve("window", "cuda", torch.float32, head_dim=fits).backend == "triton"
        assert resolve("window", "cuda", torch.float32).backend == "triton"
        if too_wide is None:
            return
        assert resolve("window", "cuda", torch.bfloat16, head_dim=(too_wide, 128)).backend == "triton"
        why = (f"float32 tiles of heads {too_wide} wide ask more shared memory than this GPU's "
               f"{facts.shared_memory // 1024} KiB a program (heads up to {fits} fit; docs/perf/float32.md); "
               f"use bfloat16/float16 inputs")
        route = resolve("window", "cuda", torch.float32, head_dim=too_wide)
        assert route.backend == "reference" and route.reason == f"auto: {why}"
        with pytest.raises(BackendUnavailableError, match=re.escape(why)):
            resolve("selected", "cuda", torch.float32, backend="triton", head_dim=too_wide)
        table = routing.explain("cuda", torch.float32, head_dim=too_wide).splitlines()
        assert table[0] == f"nsa routing for device=cuda dtype=float32 head_dim={too_wide}"
        assert table[1 + list(flags.OPS).index("window")].split()[1] == "reference"


@pytest.mark.parametrize("gpu_name, cap, small", [("rtx4090", (8, 9), True), ("rtx3090", (8, 6), True),
                                                  ("a100", (8, 0), False), ("h100", (9, 0), False)])
def test_routes_of_wide_heads_by_shared_memory(gpu, gpu_name, cap, small):
    """The window's kernels and the compressed branch's ask more shared memory than any GPU has at
    heads wider than 256 (512: 320-393 KiB of an H200's 227), and than a consumer GPU's 99 KiB
    where both the key and the value heads are wider than 128 (192/192, 256/256: 100.5-112 KiB;
    sm_89 and sm_90 compiles): those two ops take the reference there, with the reason, and an
    explicit Triton request raises it. Heads of 192/128 or 128/256 fit everywhere, 256/256 on the
    A100 and Hopper; the selected kernels read their blocks in key tiles instead and keep Triton,
    as do the ops whose launches fit."""
    from nsa.ops._triton.device import sized_as

    gpu[0] = cap
    with sized_as(gpu_name) as facts:
        for op in ("compressed", "window", "selected", "select", "decode"):
            limited = op in ("compressed", "window")
            for widths in ((192, 128), (128, 256), 128):
                assert resolve(op, "cuda", torch.bfloat16, head_dim=widths).backend == "triton", (op, widths)
            for widths in ((192, 192), (256, 256), 256):
                wide = resolve(op, "cuda", torch.float16, head_dim=widths)
                assert wide.backend == ("reference" if small and limited else "triton"), (op, widths)
            widest = resolve(op, "cuda", torch.bfloat16, head_dim=(512, 128))
            assert widest.backend == ("reference" if limited else "triton"), op
        dims = (256, 192) if small else (512, 128)
        why = (f"tiles of key and value heads {dims[0]}/{dims[1]} wide ask more shared memory than this GPU's "
               f"{facts.shared_memory // 1024} KiB a program in the window kernels (heads up to 256 fit, and on "
               f"GPUs under 128 KiB one of the two at most 128 wide, as 192/128; docs/perf/other_gpus.md)")
        assert resolve("window", "cuda", torch.bfloat16, head_dim=dims).reason == f"auto: {why}"
        with pytest.raises(BackendUnavailableError, match=re.escape(why)):
            resolve("window", "cuda", torch.bfloat16, backend="triton", head_dim=dims)


def test_public_ops_tell_the_router_their_widest_head(monkeypatch):
    """Each op with tile products routes with its key and value heads' widths ``(Dk, Dv)``, so a
    narrow ``q`` with wide values is judged by the values' width too."""
    seen = {}

    def spy(op, device, dtype, backend=None, head_dim=None):
        seen[op] = head_dim
        return routing.Route(op, "reference", "spy")

    monkeypatch.setattr(routing, "resolve", spy)
    cfg = nsa.NSAConfig(cmp_block=8, cmp_stride=4, sel_block=8, sel_count=3, window=8)
    q, k, v = torch.randn(1, 16, 2, 16), torch.randn(1, 16, 1, 16), torch.randn(1, 16, 1, 48)
    k_cmp, v_cmp = ops.mean_compress(k, cfg), ops.mean_compress(v, cfg)
    ops.compressed_attention(q, k_cmp, v_cmp, cfg)
    idx = ops.select_blocks(q, k_cmp, cfg)
    ops.selected_attention(q, k, v, idx, cfg)
    ops.sliding_window_attention(q, k, v, cfg)
    assert seen == {"compress": None, "compressed": (16, 48), "select": 16, "selected": (16, 48), "window": (16, 48)}


def test_bad_flag_value_raises_from_resolve(monkeypatch):
    monkeypatch.setenv("NSA_BACKEND_WINDOW", "fast")
    with pytest.raises(flags.FlagError, match=r"NSA_BACKEND_WINDOW='fast' \(from environment\)"):
        resolve("window", "cpu", torch.float32)


# ---------------------------------------------------------------- the public ops follow routing


def test_public_ops_follow_flags_and_arguments(monkeypatch):
    q, k, v = torch.randn(1, 20, 2, 4), torch.randn(1, 20, 1, 4), torch.randn(1, 20, 1, 3)
    cfg = nsa.NSAConfig(cmp_block=8, cmp_stride=4, sel_block=8, sel_count=4, window=8)
    monkeypatch.setattr(routing, "has_kernel", lambda op: True)
    with pytest.raises(BackendUnavailableError, match="'window': triton requested by argument"):
        ops.sliding_window_attention(q, k, v, cfg, backend="triton")
    monkeypatch.setenv("NSA_BACKEND", "triton")
    with pytest.raises(BackendUnavailableError, match="'compress': triton requested by flag NSA_BACKEND"):
        ops.mean_compress(k, cfg)
    with pytest.raises(BackendUnavailableError, match="requested by flag NSA_BACKEND"):
        ops.nsa_attention(q, k, v, torch.rand(1, 20, 2, 3), cfg)
    out = ops.nsa_attention(q, k, v, torch.rand(1, 20, 2, 3), cfg, backend="reference")
    assert out.shape == (1, 20, 2, 3) and torch.isfinite(out).all()


# ---------------------------------------------------------------- explaining


def test_routing_is_logged_once_when_asked(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="nsa.routing")
    resolve("window", "cpu", torch.float32)
    assert not caplog.records
    monkeypatch.setenv("NSA_LOG_ROUTING", "1")
    for _ in range(3):
        resolve("window", "cpu", torch.float32)
    resolve("window", "cpu", torch.float32, backend="reference")
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert messages[0].startswith("nsa route window -> reference (auto: ")
    assert messages[1] == "nsa route window -> reference (requested by argument backend=)"


def test_explain_lists_every_op_and_reports_errors(monkeypatch):
    monkeypatch.setattr(routing, "has_kernel", lambda op: op != "decode")
    monkeypatch.setattr(routing, "triton_installed", lambda: True)
    monkeypatch.setenv("NSA_BACKEND", "triton")
    monkeypatch.setenv("NSA_BACKEND_WINDOW", "reference")
    monkeypatch.setenv("NSA_BACKEND_SELCT", "reference")
    lines = routing.explain("cpu", torch.float32).splitlines()
    assert lines[0] == "nsa routing for device=cpu dtype=float32"
    rows = {line.split()[0]: line for line in lines[1 : 1 + len(flags.OPS)]}
    assert list(rows) == list(flags.OPS)
    assert rows["window"].split()[1] == "reference" and "requested by flag NSA_BACKEND_WINDOW" in rows["window"]
    assert rows["compress"].split()[1] == "ERROR" and "TRITON_INTERPRET=1" in rows["compress"]
    assert rows["decode"].split()[1] == "ERROR" and "no Triton kernel for 'decode' yet" in rows["decode"]
    assert "flags set: NSA_BACKEND=triton, NSA_BACKEND_WINDOW=reference" in lines
    assert "warning: unknown NSA_BACKEND_SELCT is ignored (did you mean NSA_BACKEND_SELECT?)" in lines


def test_nsa_imports_and_runs_on_the_reference_without_triton():
    """Triton is optional (the ``triton`` extra): where it cannot be imported, ``nsa`` and its pytest
    plugin still load, the ops route to the reference saying why, and a layer runs a prefill and a
    decode step. Here a fresh interpreter hides it (``sys.modules["triton"] = None``: importing it
    fails and ``find_spec`` finds nothing)."""
    code = """
import sys
sys.modules["triton"] = None
import torch
import nsa, pytest_nsa.plugin
from nsa import routing
print(routing.resolve("window", "cpu", torch.float32).reason)
config = nsa.NSAConfig(cmp_block=8, cmp_stride=4, sel_block=8, sel_count=4, window=16)
layer = nsa.NSAAttention(hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8, config=config)
x = torch.randn(1, 40, 32)
y = layer(x)
cache = layer.new_cache(batch_size=1)
layer(x[:, :39], cache)
step = layer(x[:, 39:], cache)
print(torch.allclose(step, y[:, 39:], atol=1e-5))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith(flags.PREFIX) and k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["auto: triton is not installed (pip install 'nsa[triton]')", "True"]


def test_cli_prints_the_route_of_every_branch():
    env = {k: v for k, v in os.environ.items() if not k.startswith(flags.PREFIX) and k != "TRITON_INTERPRET"}
    env.update(NSA_BACKEND_SELECT="reference", NSA_BACKEND_COMPRES="triton")
    cmd = [sys.executable, "-m", "nsa.routing", "--device", "cpu", "--dtype", "float32"]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "nsa routing for device=cpu dtype=float32"
    for op, line in zip(flags.OPS, lines[1:]):
        name, backend, reason = line.split(maxsplit=2)
        assert name == op and backend == "reference", line
        want = "requested by flag NSA_BACKEND_SELECT" if op == "select" else "auto: "
        assert reason.startswith(want), line
    assert "flags set: NSA_BACKEND_SELECT=reference" in lines
    assert "warning: unknown NSA_BACKEND_COMPRES is ignored (did you mean NSA_BACKEND_COMPRESS?)" in lines


def test_cli_takes_one_head_width_or_both(capsys):
    """``--head-dim`` takes ``D`` (key and value heads alike) or ``DK:DV``, and names them back."""
    routing._main(["--device", "cpu", "--dtype", "bfloat16", "--head-dim", "192:128"])
    assert capsys.readouterr().out.splitlines()[0] == "nsa routing for device=cpu dtype=bfloat16 head_dim=192:128"
    routing._main(["--device", "cpu", "--head-dim", "64"])
    assert capsys.readouterr().out.splitlines()[0] == "nsa routing for device=cpu dtype=bfloat16 head_dim=64"
    with pytest.raises(SystemExit):
        routing._main(["--device", "cpu", "--head-dim", "192:128:64"])
    assert "expected D or DK:DV (e.g. 128 or 192:128), got '192:128:64'" in capsys.readouterr().err
