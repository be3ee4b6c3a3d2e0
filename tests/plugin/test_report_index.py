"""The index of report folders (``python -m pytest_nsa.report_index``): rows from each folder's
JSON, the marked block of a file rewritten or checked, and the repository's own index current."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_nsa import report_index
from pytest_nsa.report_index import BEGIN, END

REPO = Path(__file__).resolve().parents[2]


def _env(folder: Path, commit: str, created: str, gpus=("NVIDIA H200",)) -> None:
    folder.mkdir(parents=True)
    env = {"schema_version": 1, "kind": "nsa-report-env", "created": created, "commit": {"short": commit, "dirty": None},
           "device": {"gpus": [{"index": i, "name": n} for i, n in enumerate(gpus)]},
           "software": {"torch": "2.11.0", "triton": "3.6.0"}}  # fmt: skip
    (folder / "env.json").write_text(json.dumps(env))


def _results(folder: Path, started: str, status: int, totals: dict, args: list) -> None:
    doc = {"run": {"started": started, "exit_status": status, "partial": False, "args": args}, "totals": totals}
    (folder / "results.json").write_text(json.dumps(doc))
    (folder / "report.md").write_text("# report\n")


def _reports(tmp_path: Path) -> Path:
    root = tmp_path / "reports"
    _env(root / "old", "aaaaaaa", "2026-11-20T10:00:00+00:00")
    _results(root / "old", "2026-11-20T10:00:00+00:00", 1, {"passed": 3, "failed": 1, "skipped": 2},
             ["-n", "8", "-m", "not benchmark", "tests/ops/test_decode_kernel.py", "tests/test_cache.py"])  # fmt: skip
    _env(root / "new", "b" * 40, "2026-11-22T09:30:00+00:00", gpus=("NVIDIA H200", "NVIDIA H200"))
    _results(root / "new", "2026-11-22T09:30:05+00:00", 0, {"passed": 7}, ["-q", "--gpu-profile", "auto"])
    _env(root / "lost", "ccccccc", "2026-11-21T08:00:00+00:00")  # env.json alone came back
    _env(root / "md_only", "ddddddd", "2026-11-21T09:00:00+00:00")
    (root / "md_only" / "report.md").write_text("# r\n\n- exit status 0 (all passed); 5 tests collected\n"
                                                "- command: `pytest -n 3 tests/test_module.py`\n")  # fmt: skip
    (root / "not_a_report").mkdir()
    return root


def test_rows_newest_first_from_each_folder(tmp_path):
    rows = report_index.index_rows(_reports(tmp_path))
    assert [r.folder for r in rows] == ["new", "md_only", "lost", "old"]
    new, md_only, lost, old = rows
    assert new.device == "NVIDIA H200 x2" and new.commit == "bbbbbbb" and new.result == "exit 0: 7 passed"
    assert new.tests == "all" and new.started == "2026-11-22 09:30"
    assert old.result == "**exit 1**: 3 passed, 1 failed, 2 skipped" and old.tests == "ops/decode_kernel, cache"
    assert md_only.result.startswith("exit 0 (all passed); 5 tests collected") and md_only.tests == "module"
    assert lost.result == report_index.NO_RESULTS and not lost.has_report
    table = report_index.render(rows)
    assert "[`new`](new/report.md)" in table and "| `lost` |" in table and table.count("\n") == 2 + 4


def test_write_replaces_only_the_marked_block_and_check_sees_staleness(tmp_path, capsys):
    root = _reports(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text(f"# Reports\n\nprose\n\n{BEGIN}\nold table\n{END}\n\nafter\n")
    assert report_index.main([str(root), "--check", str(readme)]) == 1
    assert "stale" in capsys.readouterr().err
    assert report_index.main([str(root), "--write", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("# Reports\n\nprose\n\n") and text.endswith(f"{END}\n\nafter\n") and "old table" not in text
    assert report_index.main([str(root), "--check", str(readme)]) == 0
    _env(root / "newer", "eeeeeee", "2026-11-23T00:00:00+00:00")  # a folder added without re-writing
    assert report_index.main([str(root), "--check", str(readme)]) == 1


def test_markers_and_root_are_checked(tmp_path, capsys):
    root = _reports(tmp_path)
    bare = tmp_path / "bare.md"
    bare.write_text(f"no markers\n{END}\n")
    with pytest.raises(SystemExit):
        report_index.main([str(root), "--write", str(bare)])
    assert "must hold the markers" in capsys.readouterr().err and bare.read_text() == f"no markers\n{END}\n"
    with pytest.raises(SystemExit):
        report_index.main([str(tmp_path / "missing")])
    assert "root:" in capsys.readouterr().err


def test_the_repositorys_report_index_is_current():
    """docs/reports/README.md lists every committed report folder (after adding one, run
    ``python -m pytest_nsa.report_index docs/reports --write docs/reports/README.md``)."""
    reports = REPO / "docs" / "reports"
    if not (reports / "README.md").is_file():
        pytest.skip("no docs/reports in this checkout")
    assert report_index.main([str(reports), "--check", str(reports / "README.md")]) == 0
