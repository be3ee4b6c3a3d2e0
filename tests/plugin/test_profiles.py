"""Unit tests of profile loading, validation and selection (no pytest run inside)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from pytest_nsa import _yaml
from pytest_nsa.hardware import GPUInfo, HardwareInfo
from pytest_nsa.profiles import SHIPPED_DIR, Catalog, ProfileError
from pytest_nsa.schema import DTYPES, FEATURES
from pytest_nsa.selection import mismatch, select

SHIPPED = ("cpu", "rtx3090", "rtx4090", "a100", "h100", "h200")
GPU_PROFILES = SHIPPED[1:]


@pytest.fixture
def shipped() -> Catalog:
    return Catalog([SHIPPED_DIR])


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_yaml_keeps_key_lines_and_reads_exponent_floats():
    data = _yaml.load("a: 1\nb:\n  c: 1e-5\n  d: [1, 2]\n", "x.yaml")
    assert data.line_of("b") == 2 and data["b"].line_of("c") == 3
    assert data["b"]["c"] == pytest.approx(1e-5) and isinstance(data["b"]["c"], float)
    assert _yaml.plain(data) == {"a": 1, "b": {"c": 1e-5, "d": [1, 2]}}


@pytest.mark.parametrize(
    "text, where, what",
    [
        ("a: 1\nb: [1, 2\n", "x.yaml:3:1", "invalid YAML"),
        ("a: 1\nb: 2\na: 3\n", "x.yaml:3", "duplicate key 'a' (first at line 1)"),
        ("a:\n  - x\n - y\n", "x.yaml:3", "invalid YAML"),
    ],
)
def test_yaml_errors_name_file_and_line(text, where, what):
    with pytest.raises(_yaml.YAMLLoadError) as err:
        _yaml.load(text, "x.yaml")
    assert str(err.value).startswith(where) and what in str(err.value)


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_profile_is_complete(shipped, name):
    profile = shipped.load(name)
    assert profile.name == name and profile.path.name == f"{name}.yaml"
    assert set(profile.features) == set(FEATURES)
    for dtype in DTYPES:
        assert 0 < profile.tolerance(dtype, "fwd") <= profile.tolerance(dtype, "grad") < 0.1
    assert set(profile.gradcheck) == {"eps", "atol", "rtol"}
    assert profile.benchmark.rounds > 0 and profile.benchmark.regression_threshold_pct > 0
    assert profile.benchmark.host_bound_threshold_pct > profile.benchmark.regression_threshold_pct
    assert all(not f.enabled and f.reason for f in [profile.feature("fa2")])


#: The prefill issue's bound for bfloat16 kernels against a higher-precision reference, outputs and
#: gradients; float16 keeps 3 more mantissa bits and float32 16 more, so theirs are tighter.
REQUIRED_BOUNDS = {"bfloat16": 1e-2, "float16": 2e-3, "float32": 1e-5}


@pytest.mark.parametrize("name", SHIPPED)
@pytest.mark.parametrize("dtype", sorted(REQUIRED_BOUNDS))
def test_no_shipped_profile_passes_a_looser_kernel_than_required(shipped, name, dtype):
    """A profile's tolerance is what a parity test accepts; a looser one would pass kernels whose
    outputs or gradients miss the bound (docs/tolerances.md has the errors measured under it)."""
    profile = shipped.load(name)
    assert profile.tolerance(dtype, "fwd") <= REQUIRED_BOUNDS[dtype]
    assert profile.tolerance(dtype, "grad") <= REQUIRED_BOUNDS[dtype]


def test_profile_values_are_the_documented_ones(shipped):
    cpu, rtx4090, h200 = shipped.load("cpu"), shipped.load("rtx4090"), shipped.load("h200")
    assert cpu.env == {"TRITON_INTERPRET": "1"} and cpu.benchmark.contexts == (512, 1024, 2048)
    assert rtx4090.env == {}
    assert rtx4090.feature("triton_float32").enabled and not rtx4090.feature("fa2").enabled
    assert rtx4090.feature("triton_selected").enabled
    assert h200.chain == ("h200", "h100", "base") and h200.device.capability == (9, 0)
    assert h200.software.cuda_min == "11.8"  # inherited from h100
    assert h200.benchmark.contexts == (4096, 8192, 16384, 32768, 65536)
    assert h200.tolerance("float64", "fwd") == 1e-10 and h200.gradcheck["rtol"] == 1e-3
    assert h200.software.triton_pairings["2.5"] == "3.1" and h200.software.triton_pairings["2.10"] == "3.6"
    with pytest.raises(TypeError):
        h200.env["NSA_BACKEND"] = "triton"  # frozen all the way down


def test_profile_tolerance_rejects_unknown_dtype_and_kind(shipped):
    profile = shipped.load("a100")
    with pytest.raises(ValueError, match="kind must be one of fwd, grad"):
        profile.tolerance("float32", "bwd")
    with pytest.raises(ValueError, match="no tolerance for dtype 'int8'"):
        profile.tolerance("int8")


@pytest.mark.parametrize(
    "body, line, expected",
    [
        ("device:\n  kind: gpu\n", 3, "device.kind: expected one of cuda, cpu, got 'gpu'"),
        ("devise: {}\n", 2, "devise: unknown key 'devise'; allowed here: name, extends"),
        ("device:\n  memory: 3\n", 3, "unknown key 'memory'; allowed here: kind, capability, name_pattern"),
        ("env:\n  NSA_BACKEND_SELECTD: reference\n", 3, "unknown flag NSA_BACKEND_SELECTD"),
        ("env:\n  NSA_BACKEND_SELECTED: fast\n", 3, "is not allowed; choose one of auto, reference, triton"),
        ("env:\n  CUDA_LAUNCH_BLOCKING: 1\n", 3, "allowed: NSA_ flags of nsa.flags, and TRITON_INTERPRET"),
        ("env:\n  NSA_DETERMINISTIC: maybe\n", 3, "is not a boolean"),
        ("tolerances:\n  float32: {fwd: 0}\n", 3, "tolerances.float32.fwd: expected a positive number"),
        ("tolerances:\n  float8: {fwd: 1.0}\n", 3, "unknown dtype 'float8'; allowed: float64, float32"),
        ("software:\n  cuda_min: 12.1\n", 3, "(unquoted, YAML reads 2.10 as the number 2.1)"),
        ("software:\n  triton_pairings: {\"2.4\": 3.0}\n", 3, "expected a quoted version"),
        ("benchmark:\n  rounds: 2.5\n", 3, "benchmark.rounds: expected a positive integer"),
        ("benchmark:\n  contexts: []\n", 3, "expected a non-empty list of positive integers"),
        ("benchmark:\n  host_bound_threshold_pct: 0\n", 3, "benchmark.host_bound_threshold_pct: expected a positive"),
        ("features:\n  triton_fast: {enabled: true}\n", 3, "unknown feature 'triton_fast'; allowed: triton"),
        ("features:\n  fa2: {enabled: 'yes'}\n", 3, "features.fa2.enabled: expected true or false"),
        ("device:\n  name_pattern: '(H100'\n", 3, "invalid regular expression"),
        ("abstract: 1\n", 2, "abstract: expected true or false, got int 1"),
    ],
)
def test_schema_errors_name_file_line_key_and_what_is_allowed(tmp_path, body, line, expected):
    path = write(tmp_path, "mine", "name: mine\n" + body)
    with pytest.raises(ProfileError) as err:
        Catalog([tmp_path]).load(str(path))
    message = str(err.value)
    assert message.startswith(f"{path}:{line}: "), message
    assert expected in message, message


def test_unknown_flag_suggests_the_closest(tmp_path):
    path = write(tmp_path, "mine", "name: mine\nenv:\n  NSA_BACKEND_SELECTD: reference\n")
    with pytest.raises(ProfileError, match="did you mean NSA_BACKEND_SELECTED"):
        Catalog([tmp_path]).load(str(path))


def test_user_profile_extends_a_shipped_one(tmp_path, shipped):
    path = write(tmp_path, "lab4090", """
        name: lab4090
        extends: rtx4090
        env:
          NSA_DETERMINISTIC: off
        features:
          fa2: {enabled: true, reason: flash-attn 2.7 installed on the lab box}
        tolerances:
          bfloat16: {fwd: 1.5e-2}
    """)
    profile = Catalog([tmp_path, SHIPPED_DIR]).load(str(path))
    assert profile.chain == ("lab4090", "rtx4090", "base")
    assert profile.env == {"NSA_DETERMINISTIC": "0"}
    assert profile.feature("fa2").enabled and profile.feature("triton_float32").enabled
    assert profile.tolerance("bfloat16") == 1.5e-2 and profile.tolerance("bfloat16", "grad") == 1e-2


def test_missing_keys_name_the_chain(tmp_path):
    write(tmp_path, "half", "name: half\nabstract: true\ndevice: {kind: cpu}\n")
    path = write(tmp_path, "mine", "name: mine\nextends: half\n")
    with pytest.raises(ProfileError) as err:
        Catalog([tmp_path]).load("mine")
    assert str(err.value).startswith(f"{path.resolve()}: profile mine lacks tolerances.float64.fwd")
    assert "nor in the profiles it extends (half)" in str(err.value)


def test_extends_cycle_and_unknown_parent(tmp_path):
    write(tmp_path, "a", "name: a\nextends: b\n")
    write(tmp_path, "b", "name: b\nextends: a\n")
    with pytest.raises(ProfileError, match="extends cycle: a -> b -> a"):
        Catalog([tmp_path]).load("a")
    write(tmp_path, "c", "name: c\nextends: h1000\n")
    with pytest.raises(ProfileError, match="unknown GPU profile 'h1000'; did you mean h100"):
        Catalog([tmp_path, SHIPPED_DIR]).load("c")


def test_name_must_match_the_file_in_a_profile_directory(tmp_path):
    write(tmp_path, "a100", "name: a100x\nextends: base\n")
    with pytest.raises(ProfileError, match="name 'a100x' differs from the file name a100.yaml"):
        Catalog([tmp_path, SHIPPED_DIR]).load("a100")


def test_project_profiles_shadow_shipped_ones(tmp_path):
    write(tmp_path, "cpu", "name: cpu\nextends: base\ndevice: {kind: cpu}\nbenchmark: {rounds: 2}\n")
    catalog = Catalog([tmp_path, SHIPPED_DIR])
    assert catalog.load("cpu").benchmark.rounds == 2
    assert catalog.load("cpu").env == {}  # the shipped cpu profile is not consulted at all
    assert "base" not in catalog.usable() and set(SHIPPED) <= set(catalog.usable())


@pytest.mark.parametrize("name", GPU_PROFILES)
def test_auto_picks_each_gpu_profile_for_its_device(shipped, hw, name):
    selection = select("auto", hw(name), shipped)
    assert selection.profile.name == name and selection.mismatch is None and selection.applied


def test_auto_without_gpu_is_cpu_and_passive_applies_nothing(shipped, hw):
    assert select("auto", hw(), shipped).profile.name == "cpu"
    passive = select(None, hw("rtx4090"), shipped)
    assert passive.profile.name == "rtx4090" and not passive.applied and passive.mode == "passive"


def test_auto_with_an_unknown_gpu(shipped):
    l40s = HardwareInfo(gpus=(GPUInfo(0, "NVIDIA L40S", (8, 9), 44.4),))
    with pytest.raises(ProfileError) as err:
        select("auto", l40s, shipped)
    assert "no profile matches NVIDIA L40S (SM 8.9, 44.4 GiB)" in str(err.value)
    assert "profile rtx4090 wants a device named like /RTX 4090/" in str(err.value)
    skipped = select("auto", l40s, shipped, on_mismatch="skip")
    assert skipped.profile.name == "cpu" and "no profile matches NVIDIA L40S" in skipped.mismatch


def test_gh200_is_not_an_h200(shipped):
    gh200 = HardwareInfo(gpus=(GPUInfo(0, "NVIDIA GH200 480GB", (9, 0), 94.5),))
    assert mismatch(shipped.load("h200"), gh200) is not None
    assert mismatch(shipped.load("h100"), gh200) is not None


@pytest.mark.parametrize(
    "profile, device, expected",
    [
        ("rtx4090", "h200", "profile rtx4090 wants SM 8.9, device 0 is NVIDIA H200 (SM 9.0, 139.8 GiB)"),
        ("h200", "h100", "profile h200 wants a device named like /\\bH200\\b/, device 0 is NVIDIA H100"),
        ("h100", None, "profile h100 needs a CUDA GPU (SM 9.0), none is visible"),
    ],
)
def test_named_profile_mismatch(shipped, hw, profile, device, expected):
    hardware = hw(device) if device else hw()
    with pytest.raises(ProfileError) as err:
        select(profile, hardware, shipped)
    assert expected in str(err.value) and "--gpu-profile-mismatch=skip" in str(err.value)
    skipped = select(profile, hardware, shipped, on_mismatch="skip")
    assert skipped.profile.name == profile and expected in skipped.mismatch


def test_small_memory_does_not_match(shipped):
    a100_40 = HardwareInfo(gpus=(GPUInfo(0, "NVIDIA A100-PCIE-40GB", (8, 0), 39.4),))
    a100_tiny = HardwareInfo(gpus=(GPUInfo(0, "NVIDIA A100 MIG 1g.10gb", (8, 0), 9.5),))
    assert mismatch(shipped.load("a100"), a100_40) is None
    assert "wants >= 38 GiB" in mismatch(shipped.load("a100"), a100_tiny)


def test_cpu_profile_fits_a_gpu_machine_and_abstract_is_refused(shipped, hw):
    assert select("cpu", hw("h100"), shipped).mismatch is None
    with pytest.raises(ProfileError, match="profile base is abstract .*; pick one of a100, cpu, h100"):
        select("base", hw(), shipped)
