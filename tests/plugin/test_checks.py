"""Unit tests of the pure modules: versions, hardware, env, markers, xdist pinning."""

from __future__ import annotations

import pytest

from pytest_nsa import env, versions, xdist
from pytest_nsa.hardware import GPUInfo, HardwareInfo, driver_version
from pytest_nsa.markers import Context, RequirementError, parse_sm, skip_reason
from pytest_nsa.profiles import SHIPPED_DIR, Catalog
from pytest_nsa.versions import ERROR, OK, WARNING, SoftwareInfo

TABLE = {"2.4": "3.0", "2.5": "3.1", "2.11": "3.6"}


def sw(**fields) -> SoftwareInfo:
    return SoftwareInfo(python="3.11.7", **fields)


TORCH_241_REQUIRES = [
    "filelock",
    'nvidia-cuda-runtime-cu12==12.1.105; platform_system == "Linux" and platform_machine == "x86_64"',
    'triton==3.0.0; platform_system == "Linux" and platform_machine == "x86_64" and python_version < "3.13"',
    'opt-einsum>=3.3; extra == "opt-einsum"',
]


def test_triton_pin_is_read_from_requires_with_markers():
    linux = {"platform_system": "Linux", "platform_machine": "x86_64", "python_version": "3.11"}
    assert versions.triton_pin(TORCH_241_REQUIRES, linux) == "triton==3.0.0"
    assert versions.triton_pin(TORCH_241_REQUIRES, {**linux, "platform_machine": "aarch64"}) is None
    assert versions.triton_pin(["filelock", "pytorch-triton==3.2.0+git0d4682f0"], linux) == "pytorch-triton==3.2.0+git0d4682f0"
    assert versions.triton_pin(None) is None


def test_detect_reads_metadata_of_what_is_installed():
    found = versions.detect(lambda dist: {"torch": "2.5.1", "pytorch-triton": "3.1.0+gitcf34004b"}.get(dist))
    assert (found.torch, found.triton, found.triton_dist, found.flash_attn) == (
        "2.5.1", "3.1.0+gitcf34004b", "pytorch-triton", None)
    real = versions.detect()
    assert real.torch is not None and real.python.count(".") == 2


def test_pairing_with_torch_pin():
    bad = versions.check_pairing(sw(torch="2.4.1", triton="3.1.0", torch_triton_pin="triton==3.0.0"), TABLE, "h100")
    assert [(v.level, v.message, v.fix) for v in bad] == [
        (ERROR, "torch 2.4.1 expects triton 3.0.x, found 3.1.0", "pip install 'triton==3.0.0'")]
    good = versions.check_pairing(sw(torch="2.5.1+cu124", triton="3.1.0", torch_triton_pin="triton==3.1.0"), TABLE, "h100")
    assert [v.level for v in good] == [OK] and "matches torch 2.5.1+cu124's pin" in good[0].message
    patch = versions.check_pairing(sw(torch="2.7.1", triton="3.3.0", torch_triton_pin="triton==3.3.1"), {}, "h100")
    assert patch[0].message == "torch 2.7.1 expects triton 3.3.1, found 3.3.0"
    missing = versions.check_pairing(sw(torch="2.5.1", torch_triton_pin="triton==3.1.0"), TABLE, "h100")
    assert missing[0].level == WARNING and "Triton is not installed" in missing[0].message


def test_pairing_with_a_compatible_release_pin():
    # torch 2.14's wheels declare 'triton~=3.8.0; platform_system == "Linux" and python_version < "3.15"'.
    requires = ['triton~=3.8.0; platform_system == "Linux" and python_version < "3.15"']
    pin = versions.triton_pin(requires, {"platform_system": "Linux", "python_version": "3.11"})
    assert pin == "triton~=3.8.0"
    assert [versions.pinned_minor(p) for p in (pin, "triton==3.6.0", "triton~=3.8", "triton>=3.6", "triton==3.*")] == [
        "3.8", "3.6", None, None, None]
    patch = versions.check_pairing(sw(torch="2.14.1", triton="3.8.2", torch_triton_pin=pin), {"2.14": "3.8"}, "h100")
    assert [v.level for v in patch] == [OK] and "matches torch 2.14.1's pin (triton~=3.8.0)" in patch[0].message
    old = versions.check_pairing(sw(torch="2.14.1", triton="3.6.0", torch_triton_pin=pin), {"2.14": "3.8"}, "h100")
    assert [(v.level, v.message) for v in old] == [(ERROR, "torch 2.14.1 expects triton 3.8.x, found 3.6.0")]
    stale = versions.check_pairing(sw(torch="2.14.1", triton="3.8.0", torch_triton_pin=pin), {"2.14": "3.7"}, "h100")
    assert [v.level for v in stale] == [OK, WARNING] and "pairs torch 2.14 with triton 3.7.x" in stale[1].message


def test_shipped_table_agrees_with_the_pins_seen():
    # Rows checked against torch's own pins; the fallback must not contradict them.
    table = Catalog([SHIPPED_DIR]).load("h100").software.triton_pairings  # base.yaml's rows
    seen = {"2.4": "triton==3.0.0", "2.11": "triton==3.6.0", "2.14": "triton~=3.8.0"}
    assert {torch: table[torch] for torch in seen} == {torch: versions.pinned_minor(p) for torch, p in seen.items()}
    assert {"2.12", "2.13"} <= set(table)


def test_pairing_table_is_a_cross_check_and_a_fallback():
    stale = versions.check_pairing(sw(torch="2.11.0+cu130", triton="3.7.0", torch_triton_pin="triton==3.7.0"),
                                   TABLE, "h200")
    assert [v.level for v in stale] == [OK, WARNING] and "torch's pin wins" in stale[1].message
    source_ok = versions.check_pairing(sw(torch="2.5.0a0+git", triton="3.1.0"), TABLE, "a100")
    assert source_ok[0].level == OK and "(profile a100 table)" in source_ok[0].message
    source_bad = versions.check_pairing(sw(torch="2.5.0", triton="3.0.0"), TABLE, "a100")
    assert source_bad[0].level == ERROR and source_bad[0].message == (
        "torch 2.5.0 expects triton 3.1.x (profile a100 table), found 3.0.0")
    unknown = versions.check_pairing(sw(torch="2.99.0", triton="4.0.0"), TABLE, "a100")
    assert unknown[0].level == WARNING and "no row for torch 2.99" in unknown[0].message


def test_pairing_of_a_cpu_build():
    cpu = versions.check_pairing(sw(torch="2.13.0+cpu", triton="3.9.0"), TABLE, "cpu")
    assert cpu[0].level == OK
    assert cpu[0].message == ("torch 2.13.0+cpu is a CPU build and declares no triton pin; "
                              "triton 3.9.0 used for the interpreter")
    assert versions.check_pairing(sw(), TABLE, "cpu")[0].level == ERROR  # no torch at all


def test_cuda_and_flash_attn_checks():
    assert versions.check_cuda("12.4", "11.8", "h100").level == OK
    assert versions.check_cuda("11.7", "11.8", "h100").message == "profile h100 needs CUDA >= 11.8, torch has CUDA 11.7"
    assert versions.check_cuda(None, "11.8", "h100").level == ERROR
    assert versions.check_cuda("12.4", None, "cpu") is None
    assert versions.check_flash_attn("2.7.4", ">=2.6", "h100").level == OK
    old = versions.check_flash_attn("2.5.8", ">=2.6", "h100")
    assert old.level == WARNING and old.message == "flash-attn 2.5.8 is outside profile h100's >=2.6; fa2 tests skip"
    assert versions.check_flash_attn(None, ">=2.6", "h100") is None


def test_driver_version_parsing(tmp_path):
    proprietary = tmp_path / "v1"
    proprietary.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 2024\nGCC version:")
    open_module = tmp_path / "v2"
    open_module.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build")
    assert driver_version(proprietary) == "550.54.15" and driver_version(open_module) == "570.86.15"
    assert driver_version(tmp_path / "absent") is None


def test_hardware_description(hw):
    two = HardwareInfo(gpus=(GPUInfo(0, "NVIDIA H200", (9, 0), 139.8), GPUInfo(1, "NVIDIA H200", (9, 0), 139.8)),
                       driver="570.86", cuda="12.8", visible_devices="2,3")
    assert two.describe() == "NVIDIA H200 (SM 9.0, 139.8 GiB) x2, driver 570.86, CUDA 12.8, CUDA_VISIBLE_DEVICES=2,3"
    assert hw().describe() == "no CUDA GPU, driver n/a, CUDA n/a" and hw().primary is None


def test_env_apply_keeps_user_values_and_restores():
    environ = {"NSA_DETERMINISTIC": "1", "NSA_BACKEND": "  "}
    done = env.apply({"NSA_DETERMINISTIC": "0", "NSA_BACKEND": "reference", "TRITON_INTERPRET": "1"}, environ)
    assert environ == {"NSA_DETERMINISTIC": "1", "NSA_BACKEND": "reference", "TRITON_INTERPRET": "1"}
    assert done.kept == {"NSA_DETERMINISTIC": ("1", "0")}
    assert done.describe() == ("NSA_BACKEND=reference (profile), TRITON_INTERPRET=1 (profile), "
                               "NSA_DETERMINISTIC=1 (yours; profile: 0)")
    done.restore(environ)
    assert environ == {"NSA_DETERMINISTIC": "1", "NSA_BACKEND": "  "}
    done.restore(environ)  # twice is harmless
    assert environ == {"NSA_DETERMINISTIC": "1", "NSA_BACKEND": "  "}


def test_env_restore_leaves_a_value_changed_since_alone():
    environ = {}
    done = env.apply({"NSA_BACKEND": "reference"}, environ)
    environ["NSA_BACKEND"] = "triton"
    done.restore(environ)
    assert environ == {"NSA_BACKEND": "triton"}


def test_user_flags_are_checked():
    errors, warnings = env.check_user_flags({"NSA_BACKEND": "fast", "NSA_BACKND": "triton", "NSA_LOG_ROUTING": "1"})
    assert len(errors) == 1 and "NSA_BACKEND='fast' (from environment) is not allowed" in errors[0]
    assert warnings == ["unknown NSA_BACKND in the environment is ignored; did you mean NSA_BACKEND?"]


def context(hardware, profile="rtx4090", software=None, environ=None, gpu_block=None, fa2=None):
    profile_obj = Catalog([SHIPPED_DIR]).load(profile)
    software = software or sw(torch="2.5.1", triton="3.1.0")
    return Context(hardware, software, profile_obj, gpu_block, environ or {}, fa2)


def reason(ctx, name, *args, **kwargs):
    return skip_reason([(name, args, kwargs)], ctx)


def test_requires_sm_memory_and_count(hw):
    ctx = context(hw("rtx4090"))
    assert reason(ctx, "requires", sm=">=9.0") == "needs SM >= 9.0, have 8.9 (rtx4090)"
    assert reason(ctx, "requires", sm="8.9") is None and reason(ctx, "requires", sm="<9.0") is None
    assert reason(ctx, "requires", sm="==8.0") == "needs SM == 8.0, have 8.9 (rtx4090)"
    assert reason(ctx, "requires", memory_gib=40) == "needs 40 GiB of GPU memory, have 23.6 GiB (rtx4090)"
    assert reason(ctx, "requires", gpu_count=2) == "needs 2 GPUs, have 1 (rtx4090)"
    assert reason(context(hw("rtx4090", "rtx4090")), "requires", gpu_count=2, memory_gib=20) is None
    assert reason(context(hw(), "cpu"), "requires", sm="8.0") == "needs a CUDA GPU, none is visible (cpu)"


def test_features_and_their_force_flags(hw, tmp_path):
    ctx = context(hw("rtx4090"))
    off = reason(ctx, "requires", feature="fa2")
    assert off.startswith("fa2 off in profile rtx4090: flash-attn is optional")
    assert reason(ctx, "requires", feature="triton_float32") is None
    assert reason(ctx, "requires", feature=["triton_window", "triton_compress", "triton_selected"]) is None
    lab = tmp_path / "lab.yaml"
    lab.write_text("name: lab\nextends: rtx4090\nfeatures:\n  triton_selected:\n    enabled: false\n"
                   "    reason: kept on the reference\n    force: {NSA_BACKEND_SELECTED: triton}\n")
    assert reason(context(hw("rtx4090"), str(lab)), "requires", feature="triton_selected") == (
        "triton_selected off in profile lab: kept on the reference")
    forced = context(hw("rtx4090"), str(lab), environ={"NSA_BACKEND_SELECTED": "triton"})
    assert reason(forced, "requires", feature="triton_selected") is None
    with pytest.raises(RequirementError, match="unknown feature 'triton_fast'"):
        reason(ctx, "requires", feature="triton_fast")


def test_triton_marker_on_gpu_and_cpu(hw):
    assert reason(context(hw("h100"), "h100"), "triton") is None
    assert reason(context(hw("h100"), "h100", software=sw(torch="2.5.1")), "triton") == "triton is not installed"
    cpu_off = context(hw(), "cpu")
    assert reason(cpu_off, "triton").startswith("Triton on CPU needs the interpreter: TRITON_INTERPRET=1 is not set")
    interpreted = dict(environ={"TRITON_INTERPRET": "1"}, software=sw(torch="2.13.0+cpu", triton="3.9.0"))
    assert reason(context(hw(), "cpu", **interpreted), "triton") is None
    assert reason(context(hw(), "cpu", **interpreted), "requires", triton=True) is None


@pytest.mark.parametrize("triton, runs", [("3.6.0", False), ("3.7.1", True), ("3.8.0", True), ("3.9.0", True),
                                          ("3.10.0+git1a2b", True), ("3.7.0rc1", True), ("2.3.1", False)])
def test_the_interpreter_needs_triton_3_7(hw, triton, runs):
    """Triton 3.6's interpreter stops at the kernels' tensor loop bounds: on the CPU their tests
    skip, saying so, and the CPU build's pairing verdict warns; a GPU compiles, whatever the
    interpreter would do."""
    cpu = sw(torch="2.13.0+cpu", triton=triton)
    skip = reason(context(hw(), "cpu", software=cpu, environ={"TRITON_INTERPRET": "1"}), "triton")
    verdict = versions.check_pairing(cpu, TABLE, "cpu")[0]
    if runs:
        assert skip is None and verdict.level == OK
    else:
        assert skip == (f"triton {triton}'s CPU interpreter cannot run nsa's kernels (it rejects tensor loop "
                        "bounds); fix: pip install 'triton>=3.7'")
        assert verdict.level == WARNING and verdict.fix == "pip install 'triton>=3.7'"
        assert verdict.message.endswith("(it rejects tensor loop bounds), so the Triton tests skip")
    assert reason(context(hw("h100"), "h100", software=sw(torch="2.11.0", triton=triton)), "triton") is None


def test_gpu_and_fa2_markers(hw):
    assert reason(context(hw("a100"), "a100"), "gpu") is None
    blocked = context(hw("h200"), "rtx4090", gpu_block="GPU tests off: profile rtx4090 wants SM 8.9")
    assert reason(blocked, "gpu") == "GPU tests off: profile rtx4090 wants SM 8.9"
    assert reason(blocked, "requires", sm=">=8.0") == "GPU tests off: profile rtx4090 wants SM 8.9"
    assert reason(context(hw("a100"), "a100"), "fa2") == "flash_attn is not installed"
    with_fa = context(hw("a100"), "a100", software=sw(torch="2.5.1", triton="3.1.0", flash_attn="2.7.4"))
    assert reason(with_fa, "fa2").startswith("fa2 off in profile a100: flash-attn is optional; enable with")
    old = versions.check_flash_attn("2.5.8", ">=2.6", "a100")
    with_old = context(hw("a100"), "a100", software=sw(torch="2.5.1", flash_attn="2.5.8"), fa2=old)
    assert reason(with_old, "requires", fa2=True) == "flash-attn 2.5.8 is outside profile a100's >=2.6; fa2 tests skip"
    assert reason(context(hw(), "cpu"), "fa2") == "flash-attn needs a CUDA GPU, none is visible (cpu)"


def test_first_unmet_need_wins_and_selection_markers_need_nothing(hw):
    ctx = context(hw("rtx4090"))
    marks = [("parity", (), {}), ("long_context", (), {}), ("requires", (), {"sm": "9.0"}), ("fa2", (), {})]
    assert skip_reason(marks, ctx) == "needs SM >= 9.0, have 8.9 (rtx4090)"
    assert skip_reason([("parity", (), {}), ("benchmark", (), {})], ctx) is None


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        (("9.0",), {}, "keyword arguments only"),
        ((), {"smx": "9.0"}, "requires() got smx; it takes sm, memory_gib"),
        ((), {"sm": "nine"}, "requires(sm='nine'): expected e.g. '>=9.0'"),
        ((), {"memory_gib": -1}, "requires(memory_gib=-1): expected a positive number"),
    ],
)
def test_requires_misuse_is_an_error(hw, args, kwargs, message):
    with pytest.raises(RequirementError) as err:
        skip_reason([("requires", args, kwargs)], context(hw("h100"), "h100"))
    assert message in str(err.value)


def test_parse_sm_forms():
    assert parse_sm(">=9.0") == (">=", (9, 0)) and parse_sm(8.9) == (">=", (8, 9)) and parse_sm("< 10.0") == ("<", (10, 0))


def test_xdist_pool_and_pins():
    assert xdist.pool_for(2, {}) == ("0", "1") and xdist.pool_for(0, {}) == ()
    assert xdist.pool_for(2, {"CUDA_VISIBLE_DEVICES": "3,5,7"}) == ("3", "5")
    assert xdist.plan({"PYTEST_XDIST_WORKER": "gw3", xdist.POOL_ENV: "0,1"}) == xdist.Pin("gw3", "1", ("0", "1"))
    assert xdist.plan({"PYTEST_XDIST_WORKER": "gw1", "CUDA_VISIBLE_DEVICES": "GPU-aa, GPU-bb"}).device == "GPU-bb"
    assert xdist.plan({"PYTEST_XDIST_WORKER": "gw1"}) is None and xdist.plan({xdist.POOL_ENV: "0,1"}) is None
    environ = {"PYTEST_XDIST_WORKER": "gw0", xdist.POOL_ENV: "4,6", "CUDA_VISIBLE_DEVICES": "4,6"}
    pin, previous = xdist.pin(environ)
    assert pin.device == "4" and environ["CUDA_VISIBLE_DEVICES"] == "4"
    xdist.restore(previous, environ)
    assert environ["CUDA_VISIBLE_DEVICES"] == "4,6"


def test_xdist_workers_share_the_cpu_cores():
    """Each worker's torch gets its share of the cores (at least one thread), unless the user set
    OMP_NUM_THREADS; outside a worker nothing changes."""
    worker = {"PYTEST_XDIST_WORKER": "gw1", xdist.WORKER_COUNT_ENV: "2"}
    assert xdist.cpu_threads(worker, 2) == 1 and xdist.cpu_threads(worker, 16) == 8
    assert xdist.cpu_threads({**worker, xdist.WORKER_COUNT_ENV: "3"}, 2) == 1
    assert xdist.cpu_threads({**worker, "OMP_NUM_THREADS": "4"}, 16) is None
    assert xdist.cpu_threads({xdist.WORKER_COUNT_ENV: "2"}, 16) is None  # the controller
    assert xdist.cpu_threads({"PYTEST_XDIST_WORKER": "gw0", xdist.WORKER_COUNT_ENV: "x"}, 16) is None


def test_xdist_publish_respects_a_user_pool():
    environ = {"CUDA_VISIBLE_DEVICES": "1,2"}
    previous = xdist.publish(2, environ)
    assert environ[xdist.POOL_ENV] == "1,2"
    xdist.restore(previous, environ)
    assert xdist.POOL_ENV not in environ
    assert xdist.publish(2, {xdist.POOL_ENV: "7"}) == {} and xdist.publish(0, {}) == {}


def test_triton_over_pin_reports_the_installed_triton_as_torchs_pin(monkeypatch):
    """``scripts/triton_over_pin.py`` (GPU sessions' runs under a newer Triton than torch pins): the
    pairing then passes, and the software record says which pin it replaced; without a pin it
    leaves detection alone."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "triton_over_pin.py"
    spec = importlib.util.spec_from_file_location("triton_over_pin", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    pinned = sw(torch="2.11.0+cu130", triton="3.9.0", triton_dist="triton", torch_triton_pin="triton==3.6.0")
    assert versions.check_pairing(pinned, TABLE, "h100")[0].level == ERROR
    monkeypatch.setattr(module, "detect", lambda: pinned)
    over = module.pytest_nsa_detect_software(config=None)
    assert (over.torch, over.triton, over.torch_triton_pin) == ("2.11.0+cu130", "3.9.0", "triton==3.9.0")
    assert "torch pins triton==3.6.0; triton 3.9.0 run in its place" in over.source
    assert over.source in over.describe()
    assert versions.check_pairing(over, {}, "h100")[0].level == OK
    monkeypatch.setattr(module, "detect", lambda: sw(torch="2.13.0+cpu", triton="3.9.0"))
    assert module.pytest_nsa_detect_software(config=None) is None
