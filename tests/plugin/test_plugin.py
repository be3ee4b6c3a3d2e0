"""Acceptance tests: real pytest runs through pytester, hardware faked by a conftest.

In-process runs (the ``inprocess`` fixture) also check that the profile's flags
are gone from ``os.environ`` afterwards; runs that depend on the environment a
fresh process starts with (user flags, import-time values, xdist) use
``runpytest_subprocess``.
"""

from __future__ import annotations

import json
import re
import textwrap

import pytest

from pytest_nsa import lifecycle
from pytest_nsa.profiles import SHIPPED_DIR

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")

MARKED_TESTS = '''
import os
import pytest

@pytest.mark.gpu
def test_gpu():
    pass

@pytest.mark.triton
def test_triton():
    pass

@pytest.mark.fa2
def test_fa2():
    pass

@pytest.mark.requires(sm=">=9.0")
def test_hopper():
    pass

@pytest.mark.requires(feature="triton_selected")
def test_selected_kernel():
    pass

@pytest.mark.requires(feature="triton_float32")
def test_float32_kernel():
    pass

@pytest.mark.parity
def test_parity(nsa_profile, nsa_tolerance):
    assert nsa_tolerance("float32") == nsa_profile.tolerance("float32")

def test_flag_seen():
    print("SEEN NSA_BACKEND_SELECTED=%s" % os.environ.get("NSA_BACKEND_SELECTED"))
'''


@pytest.mark.parametrize("name", ["cpu", "rtx3090", "rtx4090", "a100", "h100", "h200"])
def test_every_shipped_profile_runs_on_its_device(pytester, fake, inprocess, name):
    fake(*([] if name == "cpu" else [name]))
    pytester.makepyfile(test_x=MARKED_TESTS)
    result = inprocess("--gpu-profile", name, "-v")
    result.stdout.fnmatch_lines([f"nsa profile: {name} (*{name}.yaml; --gpu-profile {name})", "nsa device: *"])
    outcomes = result.parseoutcomes()
    assert result.ret == 0 and outcomes["passed"] >= 2
    hopper = "PASSED" if name in ("h100", "h200") else "SKIPPED"
    result.stdout.fnmatch_lines([f"*test_hopper {hopper}*"])
    if name == "cpu":
        result.stdout.fnmatch_lines(["*TRITON_INTERPRET=1 (profile)*"])
    result.stdout.fnmatch_lines(["*test_selected_kernel PASSED*", "*test_float32_kernel PASSED*"])


def test_auto_picks_the_faked_device_and_explains_skips(pytester, fake, inprocess, gpu_stack):
    fake("rtx4090", software=gpu_stack)  # the triton test runs, Triton installed here or not
    pytester.makepyfile(test_x=MARKED_TESTS)
    result = inprocess("--gpu-profile", "auto", "-rs", "-s")
    result.stdout.fnmatch_lines([
        "nsa profile: rtx4090 (*rtx4090.yaml; --gpu-profile auto: matches NVIDIA GeForce RTX 4090 (SM 8.9, 23.6 GiB))",
        "nsa device: NVIDIA GeForce RTX 4090 (SM 8.9, 23.6 GiB), driver 550.54.15, CUDA 12.4 [faked by conftest]",
        "nsa flags: none",
        "nsa features off: fa2 (flash-attn is optional*",
        "*SEEN NSA_BACKEND_SELECTED=None*",
        "*nsa: skipped tests by reason*",
        "1  flash_attn is not installed",
        "1  needs SM >= 9.0, have 8.9 (rtx4090)",
        "SKIPPED [[]1] test_x.py:*: needs SM >= 9.0, have 8.9 (rtx4090)",
    ])
    result.assert_outcomes(passed=6, skipped=2)


def test_named_profile_that_does_not_match_is_an_error(pytester, fake, inprocess):
    fake("h200")
    pytester.makepyfile(test_x=MARKED_TESTS)
    result = inprocess("--gpu-profile", "rtx4090")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "ERROR: pytest_nsa: --gpu-profile rtx4090: profile rtx4090 wants SM 8.9, device 0 is NVIDIA H200 "
        "(SM 9.0, 139.8 GiB). Use --gpu-profile auto, or --gpu-profile-mismatch=skip*"])


def test_mismatch_skip_runs_with_gpu_tests_skipped(pytester, fake, inprocess):
    fake("h200")
    pytester.makepyfile(test_x=MARKED_TESTS)
    result = inprocess("--gpu-profile", "rtx4090", "--gpu-profile-mismatch=skip")
    result.stdout.fnmatch_lines([
        "nsa profile MISMATCH: profile rtx4090 wants SM 8.9, device 0 is NVIDIA H200*",
        "3  GPU tests off: profile rtx4090 wants SM 8.9, device 0 is NVIDIA H200 (SM 9.0, 139.8 GiB) "
        "(--gpu-profile-mismatch=skip)",
    ])
    result.assert_outcomes(passed=4, skipped=4)


def test_bad_yaml_names_file_and_line(pytester, inprocess):
    path = pytester.path / "broken.yaml"
    path.write_text("name: broken\nextends: cpu\nenv:\n  NSA_BACKEND: [reference\n")
    result = inprocess("--gpu-profile", str(path))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: pytest_nsa: {path}:5:1: invalid YAML: *"])


@pytest.mark.parametrize(
    "body, message",
    [
        ("envv:\n  NSA_BACKEND: reference\n", "{path}:3: envv: unknown key 'envv'; allowed here: name, extends, *"),
        ("env:\n  NSA_BACKEND_SELECTD: reference\n",
         "{path}:4: env.NSA_BACKEND_SELECTD: unknown flag NSA_BACKEND_SELECTD (from {path}:4); "
         "did you mean NSA_BACKEND_SELECTED?*"),
        ("env:\n  NSA_REFERENCE_CHUNK: -4\n", "{path}:4: env.NSA_REFERENCE_CHUNK: NSA_REFERENCE_CHUNK=-4 * must be >= 0"),
    ],
)
def test_profile_errors_are_usage_errors(pytester, inprocess, body, message):
    path = pytester.path / "mine.yaml"
    path.write_text("name: mine\nextends: cpu\n" + body)
    result = inprocess("--gpu-profile", str(path))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: pytest_nsa: " + message.format(path=path)])


def test_project_profile_directory_and_list(pytester, inprocess):
    profiles = pytester.mkdir("gpu_profiles")
    (profiles / "lab.yaml").write_text("name: lab\nextends: a100\ndescription: our lab box\n")
    (profiles / "typo.yaml").write_text("name: typo\nextends: a100\ndevice: {sm: 8.0}\n")
    result = inprocess("--gpu-profile-list")
    assert result.ret == 0
    result.stdout.fnmatch_lines([
        "a100       SM 8.0, name ~ /\\bA100\\b/, >= 38 GiB; off: fa2 (extends base) - NVIDIA A100*",
        "base       abstract base for other profiles",
        "cpu        CPU only; off: fa2 (extends base) - *",
        "h100 *", "h200 *(extends h100)*",
        "lab        SM 8.0, *(extends a100) - our lab box",
        "rtx3090    SM 8.6, *off: fa2 (extends base)*", "rtx4090    SM 8.9, *",
        "typo       INVALID: *typo.yaml:3: device.sm: unknown key 'sm'; allowed here: kind, capability*",
        f"searched: {profiles}, {SHIPPED_DIR}",
    ])


def test_pairing_error_from_faked_software(pytester, fake, inprocess):
    fake("h100", software={"python": "3.11.7", "torch": "2.4.1+cu121", "triton": "3.1.0",
                           "torch_triton_pin": "triton==3.0.0"})
    pytester.makepyfile(test_x="def test_ok():\n    pass\n")
    result = inprocess("--gpu-profile", "auto")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: pytest_nsa: torch 2.4.1+cu121 expects triton 3.0.x, found 3.1.0; "
                                 "fix: pip install 'triton==3.0.0'"])
    passive = inprocess()  # without a profile the verdict is reported, not enforced
    passive.stdout.fnmatch_lines(["nsa check pairing: error: torch 2.4.1+cu121 expects triton 3.0.x, found 3.1.0*"])
    assert passive.ret == 0


def test_passive_without_profile_applies_nothing_but_still_skips(pytester, fake, inprocess):
    fake("rtx4090")
    pytester.makepyfile(test_x=MARKED_TESTS)
    result = inprocess("-s")
    result.stdout.fnmatch_lines([
        "nsa profile: rtx4090 (*; passive (values only, flags not applied); matches NVIDIA GeForce RTX 4090*",
        "nsa flags: none applied (passive; --gpu-profile auto, NAME or PATH applies a profile's)",
        "*SEEN NSA_BACKEND_SELECTED=None*",
        "1  needs SM >= 9.0, have 8.9 (rtx4090)",
    ])


#: A run of another project's tests, in a fresh process with none of the plugin's options: what each
#: test prints is what the plugin left it.
ANOTHER_PROJECT = '''
import os
import sys
import pytest

@pytest.mark.gpu
def test_marked_gpu_runs_unjudged():
    print("TORCH IMPORTED %s" % ("torch" in sys.modules))
    print("NSA ENV %s" % sorted(k for k in os.environ if k.startswith("NSA_") or k == "TRITON_INTERPRET"))

def test_timed(benchmark):
    benchmark(sum, range(10))

def test_fixture(nsa_device):
    pass
'''


def test_a_run_without_its_options_is_left_alone(pytester, subprocess):
    """pytest loads the plugin into every run of an environment where nsa is installed. A run that
    asks for none of it (another project's) keeps its time and its behaviour: no torch import
    (seconds), no detection, flags, header lines or skips; no baseline compared against its
    pytest-benchmark results, nor our fields in their JSON; the fixtures say how to engage it."""
    pytester.makepyfile(test_other=ANOTHER_PROJECT)
    result = subprocess("-s", "-rA", "--benchmark-json=bench.json", engaged=False)
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*TORCH IMPORTED False", "NSA ENV []",
                                 "*pytest_nsa is not engaged in this run: pass --gpu-profile auto *"])
    # neither header lines ("nsa profile: ...") nor summary sections ("--- nsa: skipped tests ---")
    assert not [line for line in result.stdout.lines if line.startswith("nsa ") or " nsa: " in line]
    assert "nsa" not in json.loads((pytester.path / "bench.json").read_text())["machine_info"]


@pytest.mark.parametrize("option", ["--gpu-profile=none", "--gpu-profile-mismatch=skip", "--nsa-bench",
                                    "--nsa-baseline=off", "--nsa-baseline-dir=baselines", "--nsa-report-commit=abc"])
def test_any_of_its_options_engages_it(pytester, fake, inprocess, option):
    fake("rtx4090")
    pytester.makepyfile(test_x=MARKED_TESTS)
    result = inprocess(option, engaged=False)
    result.stdout.fnmatch_lines(["nsa profile: rtx4090 (*; passive (values only, flags not applied)*",
                                 "1  needs SM >= 9.0, have 8.9 (rtx4090)"])


def test_every_option_it_registers_engages_it(inprocess):
    """An option added to the plugin's group without a place in ``lifecycle.OPTIONS`` would leave a
    run that gives it alone: the group as ``--help`` lists it is exactly those options."""
    lines = inprocess("--help", engaged=False).stdout.lines
    start = lines.index("NSA GPU profiles (pytest_nsa):")
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith(" "))
    listed = {re.match(r"\s+--([\w-]+)", line).group(1).replace("-", "_") for line in lines[start + 1:end]
              if re.match(r"\s+--", line)}
    assert listed == set(lifecycle.OPTIONS)


def test_marker_selection_and_strict_markers(pytester, inprocess):
    pytester.makepyfile(test_x=MARKED_TESTS + textwrap.dedent('''
        @pytest.mark.gradcheck
        @pytest.mark.benchmark
        @pytest.mark.long_context
        def test_all_the_rest():
            pass
    '''))
    result = inprocess("--strict-markers", "-m", "parity or gradcheck", "--gpu-profile", "cpu")
    result.assert_outcomes(passed=2, deselected=7)
    markers = inprocess("--markers")
    markers.stdout.fnmatch_lines(["@pytest.mark.triton: *", "@pytest.mark.requires(sm=None, memory_gib=None, *"])


def test_requires_misuse_stops_the_run(pytester, inprocess):
    pytester.makepyfile(test_x="import pytest\n@pytest.mark.requires(smx='9.0')\ndef test_a():\n    pass\n")
    result = inprocess("--gpu-profile", "cpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: test_x.py::test_a: requires() got smx; it takes sm, memory_gib, *"])


def test_fixtures_and_results_in_stash(pytester, fake, inprocess):
    fake("a100", extra=textwrap.dedent('''
        from pytest_nsa.state import get_state

        def pytest_sessionfinish(session):
            results = get_state(session.config).results
            print("COUNTS", sorted(results.counts().items()))
            print("MARKS", results.outcomes["test_x.py::test_tol"].markers)
            print("SKIPS", results.skips_by_reason())
    '''))
    pytester.makepyfile(test_x=textwrap.dedent('''
        import pytest, torch

        @pytest.mark.parity
        @pytest.mark.gradcheck
        def test_tol(nsa_profile, nsa_tolerance, nsa_gradcheck_tolerance, nsa_device, nsa_hardware):
            assert nsa_profile.name == "a100" and nsa_hardware.gpus[0].capability == (8, 0)
            assert nsa_tolerance(torch.bfloat16) == 1e-2 and nsa_tolerance(torch.float16, "grad") == 2e-3
            assert nsa_tolerance(torch.float64, kind="grad") == 1e-8 and nsa_tolerance("float32") == 1e-5
            assert nsa_gradcheck_tolerance == {"eps": 1e-6, "atol": 1e-5, "rtol": 1e-3}
            assert nsa_device.type == ("cuda" if torch.cuda.is_available() else "cpu")
            with pytest.raises(ValueError, match="kind must be one of fwd, grad"):
                nsa_tolerance(torch.float32, "bwd")

        @pytest.mark.fa2
        def test_fa2():
            pass
    '''))
    out = inprocess("--gpu-profile", "a100", "-s").stdout.str()
    assert "COUNTS [('passed', 1), ('skipped', 1)]" in out
    assert "MARKS ('gradcheck', 'parity')" in out
    assert "SKIPS [('flash_attn is not installed', 1)]" in out


#: A lab's own profile that keeps selected attention on the reference unless the user forces it.
BOX4090 = """\
name: box4090
extends: rtx4090
description: a lab's RTX 4090
env:
  NSA_BACKEND_SELECTED: reference
features:
  triton_selected:
    enabled: false
    reason: kept on the reference in this lab
    force:
      NSA_BACKEND_SELECTED: triton
"""


def test_user_flag_wins_over_profile_and_forces_feature(pytester, fake, subprocess, inprocess, monkeypatch):
    fake("rtx4090")
    pytester.makepyfile(test_x=MARKED_TESTS)
    (pytester.mkdir("gpu_profiles") / "box4090.yaml").write_text(BOX4090)
    profile_off = inprocess("--gpu-profile", "box4090", "-s", "-v")
    profile_off.stdout.fnmatch_lines([
        "nsa flags: NSA_BACKEND_SELECTED=reference (profile)",
        "*test_selected_kernel SKIPPED*",
        "*SEEN NSA_BACKEND_SELECTED=reference*",
        "1  triton_selected off in profile box4090: kept on the reference in this lab",
    ])
    monkeypatch.setenv("NSA_BACKEND_SELECTED", "triton")
    result = subprocess("--gpu-profile", "box4090", "-s", "-v")
    result.stdout.fnmatch_lines([
        "nsa flags: NSA_BACKEND_SELECTED=triton (yours; profile: reference)",
        "*test_selected_kernel PASSED*",
        "*SEEN NSA_BACKEND_SELECTED=triton*",
    ])
    monkeypatch.setenv("NSA_BACKEND_SELECTED", "fastest")
    bad = inprocess("--gpu-profile", "box4090")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["ERROR: pytest_nsa: NSA_BACKEND_SELECTED='fastest' (from environment) is not allowed*"])


def test_cpu_profile_flags_are_set_before_conftests_import(pytester, subprocess, fake, interpreter_stack):
    # the machine's own hardware, and a Triton whose interpreter runs the test wherever the suite runs
    fake(software=interpreter_stack, real_hardware=True,
         extra="import os\nAT_IMPORT = os.environ.get('TRITON_INTERPRET')\n")
    pytester.makepyfile(test_x=textwrap.dedent('''
        import conftest, pytest

        @pytest.mark.triton
        def test_interpreter_was_on_at_conftest_import():
            assert conftest.AT_IMPORT == "1"
    '''))
    result = subprocess("--gpu-profile", "cpu")  # the cpu profile fits GPU machines too
    result.stdout.fnmatch_lines(["nsa flags: TRITON_INTERPRET=1 (profile)"])
    result.assert_outcomes(passed=1)


def test_xdist_pins_one_gpu_per_worker_and_gathers_skips(pytester, fake, subprocess, monkeypatch):
    fake("a100", "a100")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    pytester.makepyfile(test_x=textwrap.dedent('''
        import os
        import pytest

        EXPECTED = {"gw0": "3", "gw1": "5"}

        @pytest.mark.parametrize("i", range(6))
        def test_pinned(i):
            assert os.environ["CUDA_VISIBLE_DEVICES"] == EXPECTED[os.environ["PYTEST_XDIST_WORKER"]]

        @pytest.mark.parametrize("i", range(3))
        @pytest.mark.requires(sm=">=9.0")
        def test_hopper(i):
            pass
    '''))
    result = subprocess("-n", "2", "--gpu-profile", "a100")
    result.stdout.fnmatch_lines([
        "*nsa: skipped tests by reason*",
        "3  needs SM >= 9.0, have 8.0 (a100)",
        "*nsa: xdist workers*",
        "gw0: gw0 -> CUDA_VISIBLE_DEVICES=3 (pool 3,5); * CPU thread(s); *",
        "gw1: gw1 -> CUDA_VISIBLE_DEVICES=5 (pool 3,5); * CPU thread(s); *",
    ])
    result.assert_outcomes(passed=6, skipped=3)
