"""``--nsa-report DIR``: the validation report written at the end of a run.

Runs go through pytester under the ``cpu`` profile (or ``tiny``: cpu with benchmark
points small enough for a test): in process where nothing outside pytest's own
state is touched, in a subprocess for pytest-xdist. Every
assertion compares the report with what the run really did (pytest's own
outcome counts, the tests written here), never with a stored copy.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import math
import os
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, List

import pytest

from nsa.bench.baselines import format_seconds
from pytest_nsa import report_bench, report_md, report_plots, report_schema
from pytest_nsa.report import first_error_line
from pytest_nsa.report_data import OUTCOMES, git_commit, slug
from pytest_nsa.report_md import SECTIONS

MIXED = """
import pytest

@pytest.mark.parity
def test_parity_ok():
    pass

@pytest.mark.parity
@pytest.mark.triton
def test_parity_bad():
    value = 3
    assert value == 4, "kernel and reference differ"

@pytest.mark.gradcheck
@pytest.mark.parametrize("n", [1, 2])
def test_grad(n):
    pass

@pytest.mark.skip(reason="needs a warm cache")
def test_cold():
    pass

@pytest.mark.fa2
def test_flash():
    pass

@pytest.mark.long_context
def test_long():
    raise ValueError("context too long: 65536")

@pytest.mark.xfail(reason="known gap", strict=True)
def test_gap():
    assert False
"""


#: Comparisons through nsa.testing.assert_close in parity tests: 1 % and 40 % of the bound, 150 % (fails),
#: NaN (fails); one more in a test without the marker, which the margins leave out.
MARGINS = """
import pytest
import torch

from nsa.testing import assert_close

@pytest.mark.parity
def test_close():
    want = torch.ones(100, dtype=torch.float64)
    assert_close("o", (want * 1.004).float(), want, 1e-2)
    assert_close("dq", want * 1.0001, want, 1e-2)

@pytest.mark.parity
def test_too_far():
    want = torch.ones(4, dtype=torch.float64)
    assert_close("dk", want * 1.03, want, 2e-2)

@pytest.mark.parity
def test_nan_caught():
    want = torch.ones(4, dtype=torch.float64)
    got = want.clone()
    got[0] = float("nan")
    with pytest.raises(AssertionError):
        assert_close("lse", got, want, 1e-3)

def test_not_parity():
    want = torch.ones(4, dtype=torch.float64)
    assert_close("o", want * 1.009, want, 1e-2)
"""


def report_dirs(root: Path) -> List[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) if root.is_dir() else []


def load(folder: Path) -> Dict[str, Any]:
    return {
        "md": (folder / "report.md").read_text(),
        "env": json.loads((folder / "env.json").read_text()),
        "results": json.loads((folder / "results.json").read_text()),
    }


def pytest_counts(result: pytest.RunResult) -> Dict[str, int]:
    """pytest's summary line as ``{outcome: n}`` in the report's names."""
    parsed = result.parseoutcomes()
    out = {name: parsed.get(name, 0) for name in OUTCOMES}
    out["error"] = parsed.get("errors", parsed.get("error", 0))
    return out


def md_row(md: str, first: str, section: str = "") -> List[str]:
    """The cells of the Markdown table row whose first cell is ``first`` (in ``## section`` when given:
    on a GPU machine the GPU memory tables name tests too)."""
    if section:
        md = md.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    for line in md.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first:
            return cells[1:]
    raise AssertionError(f"no table row {first!r} in report.md")


def only_report(root: Path) -> Dict[str, Any]:
    folders = report_dirs(root)
    assert len(folders) == 1, f"expected one report folder, found {[p.name for p in folders]}"
    return {"folder": folders[0], **load(folders[0])}


def assert_valid(rep: Dict[str, Any]) -> None:
    assert report_schema.validate_named(rep["env"], "env") == []
    assert report_schema.validate_named(rep["results"], "results") == []


# -- a complete run -------------------------------------------------------------------------


def test_mixed_run_report_matches_the_run(pytester, inprocess, fake, interpreter_stack):
    fake(software=interpreter_stack)  # a CPU machine whose interpreter runs the triton test, wherever we run
    pytester.makepyfile(test_mixed=MIXED)
    result = inprocess("--gpu-profile", "cpu", "--nsa-report", "reports", "-rs")
    rep = only_report(pytester.path / "reports")
    assert re.fullmatch(r"cpu_nogit_\d{8}-\d{6}", rep["folder"].name)
    assert sorted(p.name for p in rep["folder"].iterdir()) == ["env.json", "report.md", "results.json"]
    assert_valid(rep)
    res, md = rep["results"], rep["md"]

    # Totals: pytest's own count, in results.json and in the matrix's "all" row.
    real = pytest_counts(result)
    assert real == {"passed": 3, "failed": 2, "error": 0, "skipped": 2, "xfailed": 1, "xpassed": 0}
    assert {k: res["totals"][k] for k in OUTCOMES} == real and res["totals"]["total"] == 8
    assert md_row(md, "**all**") == [str(real[k]) for k in OUTCOMES] + ["8"]
    assert not res["run"]["partial"] and res["run"]["collected"] == 8 and res["run"]["exit_status"] == 1

    # By marker: each marked test counted where it belongs.
    by = res["by_marker"]
    assert (by["parity"]["passed"], by["parity"]["failed"], by["parity"]["total"]) == (1, 1, 2)
    assert (by["triton"]["failed"], by["gradcheck"]["passed"], by["fa2"]["skipped"]) == (1, 2, 1)
    assert (by["long_context"]["failed"], by["benchmark"]["total"]) == (1, 0)
    assert (by["(no nsa marker)"]["skipped"], by["(no nsa marker)"]["xfailed"]) == (1, 1)
    assert md_row(md, "`parity`", "Results by marker") == ["1", "1", "0", "0", "0", "0", "2"]
    assert md_row(md, "`gradcheck`", "Results by marker") == ["2", "0", "0", "0", "0", "0", "2"]

    # Skips with their reasons, as pytest gave them.
    reasons = {s["reason"]: s for s in res["skips"]}
    assert reasons["needs a warm cache"]["count"] == 1
    fa2 = next(r for r in reasons if "flash-attn" in r)
    assert reasons[fa2]["markers"] == ["fa2"] and fa2 in result.stdout.str()
    assert md_row(md, "1", "Skipped tests by reason")[:1] in ([fa2.replace("|", "\\|")], ["needs a warm cache"])
    assert fa2 in md and "| 1 | needs a warm cache | - |" in md

    # Failures: test id and first error line.
    failures = {f["nodeid"]: f for f in res["failures"]}
    assert set(failures) == {"test_mixed.py::test_parity_bad", "test_mixed.py::test_long"}
    assert failures["test_mixed.py::test_parity_bad"]["message"] == "AssertionError: kernel and reference differ"
    assert failures["test_mixed.py::test_long"]["message"] == "ValueError: context too long: 65536"
    assert failures["test_mixed.py::test_long"]["markers"] == ["long_context"]
    assert md_row(md, "`test_mixed.py::test_long`", "Failures") == ["call", "ValueError: context too long: 65536"]

    for title in SECTIONS:
        assert f"## {title}" in md
    assert "PARTIAL" not in md and "no benchmark" in md.lower()
    # Nothing compared through nsa.testing: the margins say so.
    assert res["margins"]["comparisons"] == 0 and "No test compared through" in md
    assert res["benchmarks"]["status"] == "none" and res["benchmarks"]["json_file"] is None
    outcomes = {t["nodeid"]: t["outcome"] for t in res["tests"]}
    assert outcomes["test_mixed.py::test_gap"] == "xfailed" and outcomes["test_mixed.py::test_grad[2]"] == "passed"


def test_env_states_profile_flags_versions_and_routing(pytester, inprocess, fake):
    fake()  # a CPU machine, also when the suite runs on a GPU one
    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    inprocess("--gpu-profile", "cpu", "--nsa-report", "out")
    rep = only_report(pytester.path / "out")
    assert_valid(rep)
    env, md = rep["env"], rep["md"]
    assert env["software"]["torch"] == importlib.metadata.version("torch")
    assert env["profile"]["name"] == "cpu" and env["profile"]["applied"] is True
    assert env["flags"]["applied"] == {"TRITON_INTERPRET": "1"}
    assert env["device"]["slug"] == "cpu" and env["device"]["gpus"] == []
    assert [c["check"] for c in env["checks"]][0] == "pairing"
    routes = {r["op"]: r["backend"] for r in env["routing"]["ops"]}
    assert set(routes) == {"compress", "compressed", "select", "selected", "window", "gates", "decode", "rotary"}
    assert env["routing"]["device"] == "cpu" and set(routes.values()) == {"reference"}
    assert "`TRITON_INTERPRET=1`" in md and env["checks"][0]["message"] in md
    assert md_row(md, "torch")[0] == env["software"]["torch"]
    assert "fa2 (flash-attn needs a CUDA GPU)" in md
    # The markers keep their rows when no test carries them: zero, not absent.
    for marker in ("fa2", "long_context", "benchmark"):
        assert md_row(md, f"`{marker}`") == ["0"] * 7


@pytest.mark.parametrize("flag, torch_level, products", [(None, "highest", "ieee"), ("tf32", "high", "tf32")])
def test_env_states_the_flags_set_and_how_float32_multiplies(flag, torch_level, products, pytester, inprocess, fake,
                                                            monkeypatch):
    """Every NSA_ flag set for the run is recorded, not only those a profile touched, and the
    float32 products with torch's setting they follow: both change what a run computes."""
    import torch

    fake()
    for name in [n for n in os.environ if n.startswith("NSA_")]:
        monkeypatch.delenv(name)
    if flag is not None:
        monkeypatch.setenv("NSA_FLOAT32_DOT", flag)
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(torch_level)
    try:
        pytester.makepyfile(test_one="def test_one():\n    pass\n")
        inprocess("--gpu-profile", "cpu", "--nsa-report", "out")
    finally:
        torch.set_float32_matmul_precision(saved)
    rep = only_report(pytester.path / "out")
    assert_valid(rep)
    env, md = rep["env"], rep["md"]
    assert env["flags"]["in_effect"] == ({} if flag is None else {"NSA_FLOAT32_DOT": flag})
    if importlib.util.find_spec("triton") is None:  # the kernels' precision cannot be told: the report says why
        products, error = None, "ModuleNotFoundError: No module named 'triton'"
    else:
        error = None
    assert env["float32"] == {"torch_matmul_precision": torch_level, "products": products, "error": error}
    assert (f"NSA_ flags set for the run: `NSA_FLOAT32_DOT={flag}`" if flag else
            "NSA_ flags set for the run: none") in md
    shown = products or f"unknown ({error})"
    assert f"float32 products: {shown} (torch's float32 matmul precision: {torch_level}" in md


def test_faked_gpu_names_the_folder_after_the_device(pytester, fake, inprocess):
    fake("h200")
    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    inprocess("--gpu-profile", "h200", "--nsa-report", "out", "--nsa-report-commit", "abc1234")
    rep = only_report(pytester.path / "out")
    assert rep["folder"].name.startswith("nvidia-h200_abc1234_")
    assert rep["env"]["commit"] == {"short": "abc1234", "dirty": None}
    assert rep["env"]["device"]["gpus"][0]["capability"] == "9.0"
    assert rep["env"]["device"]["source"] == "faked by conftest" and rep["env"]["profile"]["name"] == "h200"
    assert_valid(rep)


def test_teardown_error_counts_once_as_error(pytester, inprocess):
    pytester.makepyfile(test_td="""
        import pytest

        @pytest.fixture
        def leaky():
            yield
            raise RuntimeError("buffer still mapped")

        def test_td(leaky):
            pass
    """)
    result = inprocess("--gpu-profile", "cpu", "--nsa-report", "out")
    res = only_report(pytester.path / "out")["results"]
    # pytest's summary says "1 passed, 1 error" for this one test; the report counts tests.
    assert pytest_counts(result)["error"] == 1 and res["totals"]["error"] == 1 and res["totals"]["total"] == 1
    assert res["failures"] == [{"nodeid": "test_td.py::test_td", "outcome": "error", "when": "teardown",
                                "message": "RuntimeError: buffer still mapped", "markers": []}]


# -- partial runs ---------------------------------------------------------------------------


def test_stop_at_first_failure_is_partial(pytester, inprocess, fake, interpreter_stack):
    fake(software=interpreter_stack)  # the triton test runs and fails second, wherever the suite runs
    pytester.makepyfile(test_mixed=MIXED)
    result = inprocess("--gpu-profile", "cpu", "--nsa-report", "out", "-x")
    rep = only_report(pytester.path / "out")
    assert_valid(rep)
    run = rep["results"]["run"]
    assert run["partial"] and run["collected"] == 8
    assert any("stopping after 1 failures" in r for r in run["partial_reasons"])
    ran = sum(pytest_counts(result).values())
    assert rep["results"]["totals"]["total"] == ran == 2
    assert f"{8 - ran} of 8 collected tests did not run to the end" in run["partial_reasons"]
    assert "**PARTIAL REPORT**" in rep["md"] and "stopping after 1 failures" in rep["md"]
    assert "PARTIAL" in result.stdout.str()


def test_keyboard_interrupt_is_partial_and_the_interrupted_test_not_counted(pytester):
    pytester.makepyfile(test_int="""
        def test_first():
            pass

        def test_stops():
            raise KeyboardInterrupt

        def test_never():
            pass
    """)
    # no_reraise_ctrlc: the interrupt stops the run under test, not this one.
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--gpu-profile", "cpu", "--nsa-report", "out",
                                          no_reraise_ctrlc=True)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    rep = only_report(pytester.path / "out")
    assert_valid(rep)
    run, totals = rep["results"]["run"], rep["results"]["totals"]
    assert run["partial"] and "interrupted by KeyboardInterrupt" in run["partial_reasons"]
    assert run["unfinished"] == ["test_int.py::test_stops"]
    assert (totals["passed"], totals["total"]) == (1, 1) == (pytest_counts(result)["passed"], 1)
    assert "interrupted by KeyboardInterrupt" in rep["md"] and "`test_int.py::test_stops`" in rep["md"]


def test_collection_error_is_reported(pytester, inprocess):
    pytester.makepyfile(test_ok="def test_ok():\n    pass\n", test_broken="import no_such_module_here\n")
    result = inprocess("--gpu-profile", "cpu", "--nsa-report", "out")
    rep = only_report(pytester.path / "out")
    assert_valid(rep)
    res = rep["results"]
    assert res["failures"][0]["nodeid"] == "test_broken.py" and res["failures"][0]["when"] == "collect"
    assert "No module named 'no_such_module_here'" in res["failures"][0]["message"]
    assert res["totals"]["error"] == pytest_counts(result)["error"] == 1
    assert res["run"]["partial"] and any("during collection" in r for r in res["run"]["partial_reasons"])


# -- xdist, options, errors -----------------------------------------------------------------


def assert_margins_of(rep: Dict[str, Any], result: pytest.RunResult) -> None:
    """The report and the terminal give each comparison of :data:`MARGINS` against its bound."""
    res, md = rep["results"], rep["md"]
    tests = {t["nodeid"]: t for t in res["tests"]}
    close = tests["test_margins.py::test_close"]["comparisons"]
    assert [c["name"] for c in close] == ["o", "dq"] and [c["bound"] for c in close] == [1e-2, 1e-2]
    assert math.isclose(close[0]["error"], 4e-3, rel_tol=1e-4) and math.isclose(close[1]["error"], 1e-4, rel_tol=1e-9)
    assert [c["dtype"] for c in close] == ["float32", "float64"]
    assert tests["test_margins.py::test_nan_caught"]["comparisons"] == [
        {"name": "lse", "error": None, "bound": 1e-3, "dtype": "float64"}]
    assert tests["test_margins.py::test_too_far"]["outcome"] == "failed"
    assert tests["test_margins.py::test_not_parity"]["comparisons"] == []
    margins = res["margins"]
    assert (margins["comparisons"], margins["tests"]) == (4, 3)
    classes = {c["share"]: c["count"] for c in margins["classes"]}
    assert classes == {"< 10%": 1, "10%-25%": 0, "25%-50%": 1, "50%-75%": 0, "75%-100%": 0, "> 100% (failed)": 2}
    closest = [(r["nodeid"].split("::")[1], r["name"]) for r in margins["closest"]]
    assert closest == [("test_nan_caught", "lse"), ("test_too_far", "dk"), ("test_close", "o"), ("test_close", "dq")]
    assert margins["closest"][0]["share"] is None and math.isclose(margins["closest"][1]["share"], 1.5, rel_tol=1e-9)
    by_dtype = {d["dtype"]: d for d in margins["by_dtype"]}
    assert sorted(by_dtype) == ["float32", "float64"] and by_dtype["float64"]["largest_share"] is None
    assert by_dtype["float32"]["comparisons"] == 1 and math.isclose(by_dtype["float32"]["largest_share"], 0.4, rel_tol=1e-4)
    assert md_row(md, "`float32`", "Parity margins") == ["1", "40%"]
    assert md_row(md, "< 10%", "Parity margins") == ["10%-25%", "25%-50%", "50%-75%", "75%-100%", "> 100% (failed)"]
    assert md_row(md, "1", "Parity margins") == ["0", "1", "0", "0", "2"]
    assert md_row(md, "150%", "Parity margins") == ["`test_margins.py::test_too_far`", "dk", "float64", "3.00e-02",
                                                     "2.0e-02"]
    assert md_row(md, "not finite", "Parity margins")[:4] == ["`test_margins.py::test_nan_caught`", "lse", "float64",
                                                              "not finite"]
    result.stdout.fnmatch_lines(["*nsa: parity margins*", "4 comparisons in 3 tests; share of the bound: < 10%: 1, "
                                 "25%-50%: 1, > 100% (failed): 2", "largest share by dtype: float32 40% (1), float64 not finite (3)",
                                 "error not finite: test_margins.py::test_nan_caught lse*",
                                 "150% of the bound: test_margins.py::test_too_far dk (3.00e-02 against 2.0e-02)"])


def test_parity_margins_give_each_comparison_against_its_bound(pytester, inprocess, fake):
    fake()
    pytester.makepyfile(test_margins=MARGINS)
    result = inprocess("--gpu-profile", "cpu", "--nsa-report", "reports")
    rep = only_report(pytester.path / "reports")
    assert_valid(rep)
    assert pytest_counts(result)["failed"] == 1
    assert_margins_of(rep, result)


def test_xdist_controller_writes_exactly_one_report(pytester, bench_project, fake, interpreter_stack):
    fake(software=interpreter_stack)  # the triton test runs (and fails), wherever the suite runs
    pytester.makepyfile(test_mixed=MIXED, test_margins=MARGINS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--gpu-profile", "tiny",
                                           "--nsa-report", "out", "-k", "not bwd")
    rep = only_report(pytester.path / "out")
    assert_valid(rep)
    res = rep["results"]
    assert {k: res["totals"][k] for k in OUTCOMES} == pytest_counts(result)
    assert res["run"]["xdist_workers"] == 2 and not res["run"]["partial"]
    assert {t["worker"] for t in res["tests"]} == {"gw0", "gw1"} and len(res["tests"]) == 8 + 4 + 4
    # each worker's note, as the terminal's worker lines print it, is in both files
    notes = res["run"]["worker_notes"]
    assert sorted(notes) == ["gw0", "gw1"]
    for worker, note in notes.items():
        result.stdout.fnmatch_lines([f"{worker}: {note}"])
        assert f"- worker {worker}: {note}" in rep["md"]
    assert len(res["failures"]) == 3 and res["by_marker"]["benchmark"]["passed"] == 4
    assert_margins_of(rep, result)  # the workers' comparisons reached the controller
    # pytest-benchmark times nothing under xdist: the benchmarks ran as smoke tests, and the report says so.
    bench = res["benchmarks"]
    assert bench["status"] == "none" and "timing disabled under pytest-xdist" in bench["note"]
    assert bench["note"] in rep["md"]


def test_no_option_no_report_and_unwritable_target_is_said(pytester, inprocess):
    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    inprocess("--gpu-profile", "cpu")
    assert report_dirs(pytester.path) == []
    blocker = pytester.path / "taken"
    blocker.write_text("a file, not a folder")
    result = inprocess("--gpu-profile", "cpu", "--nsa-report", "taken")
    assert result.ret == 0  # the tests' verdict stands
    result.stdout.fnmatch_lines(["*could not write the report under*taken*"])


def test_a_report_folder_that_became_the_rootdir_is_refused(pytester, inprocess, tmp_path_factory):
    """An existing folder outside the project, given as ``--nsa-report DIR``, is where pytest looks
    for its rootdir and ini file (it reads the command line before any plugin's options are
    known): the run would lose the project's settings, so it stops and says to write ``=``. A
    folder inside the project, or one still to be made, leaves the ini where it was."""
    pytester.makeini("[pytest]\nmarkers =\n    ours: a marker of the project's ini\n")
    pytester.makepyfile(test_one="import pytest\n\n@pytest.mark.ours\ndef test_one():\n    pass\n")
    outside = tmp_path_factory.mktemp("outside")
    result = inprocess("--strict-markers", "--gpu-profile", "cpu", "--nsa-report", str(outside))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--nsa-report {outside}: pytest took this existing folder for a test path*"
                                 f"write --nsa-report={outside} (with '=')"])
    assert report_dirs(outside) == []
    result = inprocess("--strict-markers", "--gpu-profile", "cpu", f"--nsa-report={outside}")
    assert result.ret == 0, result.stdout.str()
    assert len(report_dirs(outside)) == 1
    pytester.mkdir("inside")
    for folder in ("inside", "to_be_made"):
        assert inprocess("--strict-markers", "--gpu-profile", "cpu", "--nsa-report", folder).ret == 0
        assert len(report_dirs(pytester.path / folder)) == 1


# -- units ----------------------------------------------------------------------------------


def test_first_error_line_prefers_crash_message_then_e_lines():
    crash = SimpleNamespace(reprcrash=SimpleNamespace(message="AssertionError: x\nassert 1 == 2"))
    assert first_error_line(crash) == "AssertionError: x"
    text = "def f():\n>   g()\nE   fixture 'nope' not found\nE   more\n"
    assert first_error_line(text) == "fixture 'nope' not found"
    assert first_error_line("[XPASS(strict)] known gap") == "[XPASS(strict)] known gap"
    assert first_error_line("") == "(no error text)"


def test_git_commit_reads_a_checkout_and_says_nogit_outside(tmp_path):
    assert git_commit(tmp_path) == ("nogit", None)
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    (repo / "a.txt").write_text("one")
    git("add", "a.txt")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first")
    assert git_commit(repo) == (git("rev-parse", "--short", "HEAD"), False)
    (repo / "a.txt").write_text("two")
    assert git_commit(repo)[1] is True
    assert slug("NVIDIA GeForce RTX 4090") == "nvidia-geforce-rtx-4090"


def test_validator_finds_what_breaks_the_schema():
    schema = report_schema.load("results")
    assert report_schema.validate({}, schema)[0] == "$: missing required key 'schema_version'"
    bad_counts = {"passed": 1, "failed": -1, "error": 0, "skipped": "2", "xfailed": 0, "xpassed": True, "total": 0,
                  "extra": 1}
    errors = report_schema.validate(bad_counts, {"$ref": "#/$defs/counts", "$defs": schema["$defs"]})
    assert sorted(errors) == sorted([
        "$.failed: -1 < minimum 0", "$.skipped: expected integer, got str '2'",
        "$.xpassed: expected integer, got bool True", "$: unexpected key 'extra'",
    ])
    assert report_schema.validate({"status": "maybe"}, {"properties": {"status": {"enum": ["a", "b"]}}}) == [
        "$.status: 'maybe' is not one of ['a', 'b']"]
    with pytest.raises(report_schema.SchemaError, match="oneOf"):
        report_schema.validate(1, {"oneOf": []})


@pytest.mark.parametrize("name", sorted(report_schema.SCHEMA_FILES))
def test_schemas_are_versioned_and_accepted_by_jsonschema_when_installed(name):
    schema = report_schema.load(name)
    assert schema["properties"]["schema_version"] == {"const": report_schema.SCHEMA_VERSION}
    assert f"schema version {report_schema.SCHEMA_VERSION}" in schema["title"]
    try:
        import jsonschema
    except ImportError:  # not a dependency: the shipped validator above is the check
        return
    jsonschema.Draft202012Validator.check_schema(schema)


def test_docs_describe_the_current_schemas():
    text = (Path(__file__).resolve().parents[2] / "docs" / "reports" / "README.md").read_text()
    assert f"schema version {report_schema.SCHEMA_VERSION}" in text
    for name in report_schema.SCHEMA_FILES.values():
        assert f"src/pytest_nsa/schemas/{name}" in text


# -- benchmarks -----------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]
#: The project's benchmark suite, copied into the pytester project (test modules renamed:
#: an in-process run must not meet modules of the same name that the outer run imported).
BENCH_SUITE = {"conftest.py": "conftest.py", "_records.py": "_records.py",
               "test_decode_bench.py": "test_timed_decode.py", "test_prefill_bench.py": "test_timed_prefill.py"}
TINY_PROFILE = """
name: tiny
extends: cpu
description: the cpu profile with benchmark points small enough for a test
benchmark:
  contexts: [64]
  batch_sizes: [1]
  rounds: 3
  regression_threshold_pct: 10
  prefill_lengths: [64]
"""
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def bench_project(pytester: pytest.Pytester) -> Path:
    """The pytester project with the benchmark suite and a ``tiny`` profile; returns the
    baseline file the suite will save to."""
    suite = pytester.mkdir("benchmarks")
    for source, target in BENCH_SUITE.items():
        (suite / target).write_text((REPO / "tests" / "benchmarks" / source).read_text())
    profiles = pytester.mkdir("gpu_profiles")
    (profiles / "tiny.yaml").write_text(TINY_PROFILE)
    return profiles / "baselines" / "tiny" / "benchmarks.json"


def test_benchmarks_give_tables_plots_and_json_against_the_baseline(pytester, bench_project, inprocess):
    args = ("--gpu-profile", "tiny", "--nsa-bench", "-k", "not bwd")  # 4 points: 2 decode, 2 prefill
    first = inprocess(*args, "--nsa-baseline=save", "--nsa-report", "first")
    saved = only_report(pytester.path / "first")
    assert_valid(saved)
    bench = saved["results"]["benchmarks"]
    passed = pytest_counts(first)["passed"]
    assert bench["status"] == "measured" and bench["count"] == passed >= 4
    rows = bench["tables"]["decode"] + bench["tables"]["prefill"]
    assert len(rows) == passed and bench["tables"]["other"] == []
    assert {r["params"]["kind"] for r in bench["tables"]["decode"]} == {"decode"}
    assert all(r["verdict"] == "saved as baseline" and r["baseline"] is None for r in rows)
    # The rows carry pytest-benchmark's own medians, and its JSON sits in the folder.
    data = json.loads((saved["folder"] / bench["json_file"]).read_text())
    assert {r["name"]: r["now"] for r in rows} == {b["fullname"]: b["stats"]["median"] for b in data["benchmarks"]}
    assert [p["file"] for p in bench["plots"]] == ["decode_latency_eager.png", "prefill_speedup.png"]
    for plot in bench["plots"]:
        assert (saved["folder"] / plot["file"]).read_bytes()[:8] == PNG_MAGIC
        assert f"![{plot['title']}]({plot['file']})" in saved["md"]

    stored = json.loads(bench_project.read_text())
    assert {name: b["median"] for name, b in stored["benchmarks"].items()} == {r["name"]: r["now"] for r in rows}
    # A baseline 1000 s per call: every point of the next run must come out improved, by about -100%.
    for entry in stored["benchmarks"].values():
        entry.update(median=1000.0, q1=1000.0, q3=1000.0, iqr=0.0, mean=1000.0, min=1000.0, max=1000.0, stddev=0.0)
    bench_project.write_text(json.dumps(stored))

    second = inprocess("--gpu-profile", "tiny", "-k", "not bwd", "--nsa-report", "second")  # --nsa-bench implied
    again = only_report(pytester.path / "second")
    assert_valid(again)
    bench = again["results"]["benchmarks"]
    assert bench["baseline"] == str(bench_project) and f"`{bench_project}`" in again["md"]
    rows = bench["tables"]["decode"] + bench["tables"]["prefill"]
    assert {r["name"] for r in rows} == set(stored["benchmarks"]) and second.ret == 0
    for row in rows:
        assert row["baseline"] == 1000.0 and row["verdict"] == "improved"
        assert row["change_pct"] == pytest.approx((row["now"] / 1000.0 - 1) * 100)
        cells = md_row(again["md"], f"`{row['name'].rsplit('::', 1)[-1]}`")
        change = f"{row['change_pct']:+.1f}%"
        assert cells[:4] == [format_seconds(1000.0), format_seconds(row["now"]), change, "improved"]
    assert "### Decode" in again["md"] and "### Prefill" in again["md"]


def test_report_without_benchmark_data_says_why(pytester, bench_project, inprocess):
    inprocess("--gpu-profile", "tiny", "--nsa-report", "out", "-m", "not benchmark")
    bench = only_report(pytester.path / "out")["results"]["benchmarks"]
    assert bench["status"] == "none" and bench["plots"] == [] and bench["json_file"] is None
    assert bench["note"].startswith("No benchmark test ran in this session")
    assert not list((pytester.path / "out").glob("*/*.png")) and not list((pytester.path / "out").glob("*/bench*"))
    skipped = [SimpleNamespace(markers=("benchmark",), outcome="skipped", skip_reason="needs --nsa-bench")] * 3
    state = SimpleNamespace(measured={}, rows=[], lines=[], mode="compare", path=None)
    note = report_bench.section(None, state, skipped, pytester.path, "CPU")["note"]
    assert note == "No benchmark data: all 3 benchmark tests skipped (needs --nsa-bench)."


def test_plot_rows_pair_nsa_and_dense_by_point():
    def entry(kind, impl, mode, length, median, ratio=None):
        info = {"kind": kind, "impl": impl, "mode": mode, "shape": {"batch": 1, "length": length}}
        return SimpleNamespace(median=median, info={**info, "nsa_over_dense": ratio} if ratio else info)

    entries = {
        "d-nsa-2k": entry("decode", "nsa", "eager", 2048, 3e-5),
        "d-nsa-1k": entry("decode", "nsa", "eager", 1024, 2e-5),
        "d-dense-1k": entry("decode", "dense", "eager", 1024, 1e-5),
        "g-nsa-1k": entry("decode", "nsa", "graph", 1024, 5e-6),
        "p-nsa": entry("prefill", "nsa", "fwd", 8192, 1.0, 0.25),
        "p-dense": entry("prefill", "dense", "fwd", 8192, 4.0),
        "no-shape": SimpleNamespace(median=1.0, info={"kind": "decode"}),
    }
    rows = report_plots.decode_rows(entries)
    assert sorted(rows) == ["eager", "graph"]
    eager = [(r["context"], r["nsa_ms"], r["dense_ms"]) for r in rows["eager"]]
    assert eager[0] == (1024, pytest.approx(0.02), pytest.approx(0.01))
    assert eager[1][:2] == (2048, pytest.approx(0.03)) and math.isnan(eager[1][2])
    assert report_plots.decode_series(rows["eager"]) == {
        "NSA B=1": {1024: pytest.approx(0.02), 2048: pytest.approx(0.03)}, "dense B=1": {1024: pytest.approx(0.01)}}
    prefill = report_plots.prefill_rows(entries)
    assert [(r["length"], r["fwd_speedup"]) for r in prefill] == [(8192, 4.0)]
    assert math.isnan(prefill[0]["fwdbwd_speedup"])
    assert report_plots.prefill_series(prefill) == {"fwd": {8192: 4.0}}


def test_exit_status_line_names_a_benchmark_regression():
    def results(status, failures, verdicts):
        rows = [{"verdict": v} for v in verdicts]
        return {"run": {"exit_status": status}, "failures": failures,
                "benchmarks": {"tables": {"decode": rows, "prefill": [], "other": []}}}

    assert report_md._status(results(1, [], ["ok", "REGRESSION", "REGRESSION"])) == (
        "2 benchmark(s) regressed against the baseline; no test failed")
    assert report_md._status(results(1, [{"nodeid": "t"}], ["REGRESSION"])) == "tests failed"
    assert report_md._status(results(2, [], [])) == "interrupted"
