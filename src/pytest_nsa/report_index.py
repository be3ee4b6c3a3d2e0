"""An index of validation-report folders: one markdown row per ``--nsa-report`` run.

Each folder that ``--nsa-report`` writes holds ``env.json`` (device, software, commit) and, once
the session finished, ``results.json`` (totals, exit status, the command line). This module reads
those two files alone, so it knows nothing of pytest:

    python -m pytest_nsa.report_index docs/reports                  # print the table
    python -m pytest_nsa.report_index docs/reports --write README.md  # replace the marked block
    python -m pytest_nsa.report_index docs/reports --check README.md  # exit 1 where it is stale

``--write`` and ``--check`` act on the lines between :data:`BEGIN` and :data:`END` of the given
file, which must hold both markers once.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from pytest_nsa.report_data import OUTCOMES
from pytest_nsa.report_md import table as markdown_table

BEGIN = "<!-- report-index: begin (python -m pytest_nsa.report_index) -->"
END = "<!-- report-index: end -->"
ENV, RESULTS = "env.json", "results.json"


@dataclass(frozen=True)
class IndexRow:
    """What the index shows of one report folder."""

    folder: str
    device: str
    commit: str
    software: str
    started: str
    result: str
    tests: str

    has_report: bool = True

    def cells(self) -> List[str]:
        link = f"[`{self.folder}`]({self.folder}/report.md)" if self.has_report else f"`{self.folder}`"
        return [link, self.device, self.commit, self.software, self.started, self.result, self.tests]


NO_RESULTS = "env.json alone kept (no results)"
COLUMNS = ("report", "device", "commit", "torch / triton", "started (UTC)", "result", "tests")


def _load(path: Path) -> Optional[Dict[str, Any]]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: not a readable JSON document ({err})") from err


def _test_paths(args: Sequence[str]) -> str:
    """The test files or node ids a command line named, shortened (``tests/ops/test_x.py`` ->
    ``ops/x``); ``all`` when it named none."""
    picked = [a for a in args if not a.startswith("-") and (a.endswith(".py") or "::" in a or a.startswith("tests"))]
    short = []
    for arg in picked:
        name = arg[len("tests/"):] if arg.startswith("tests/") else arg
        name = name.replace("/test_", "/").removeprefix("test_").replace(".py", "")
        short.append(name.rstrip("/") or "tests")
    return ", ".join(short) if short else "all"


def _exit(status: object) -> str:
    """A run's exit status as the index shows it: bold unless 0."""
    return "exit 0" if str(status) == "0" else f"**exit {status}**"


def _result(results: Dict[str, Any]) -> str:
    totals, run = results.get("totals", {}), results.get("run", {})
    counts = [f"{totals[k]} {k}" for k in OUTCOMES if totals.get(k)]
    head = _exit(run.get("exit_status"))
    partial = ", partial" if run.get("partial") else ""
    return f"{head}{partial}: {', '.join(counts) or 'no tests'}"


def _from_report_md(text: str) -> Tuple[str, str]:
    """``(result, tests)`` from the header of a ``report.md`` whose ``results.json`` was not kept:
    its ``- exit status ...`` line and the files of its ``- command: `...``` line (the lines that
    :mod:`pytest_nsa.report_md` writes)."""
    result, tests = "", ""
    for line in text.splitlines():
        if line.startswith("- exit status ") and not result:
            status, _, rest = line[len("- exit status "):].partition(" ")
            result = f"{_exit(status)} {rest.strip()} (report.md only)"
        elif line.startswith("- command: `") and not tests:
            tests = _test_paths(line[len("- command: `"):].rstrip("`").split())
    return result or "report.md only, no exit status", tests


def read_row(folder: Path) -> Optional[IndexRow]:
    """The index row of one report folder, or ``None`` when it holds no ``env.json`` (not a report)."""
    env = _load(folder / ENV)
    if env is None:
        return None
    results = _load(folder / RESULTS)
    device = env.get("device", {})
    names = sorted({g.get("name", "?") for g in device.get("gpus", [])}) or ["no GPU"]
    gpus = len(device.get("gpus", []))
    software = env.get("software", {})
    commit = env.get("commit", {})
    started = (results or {}).get("run", {}).get("started") or env.get("created", "")
    report_md = folder / "report.md"
    if results is not None:
        result, tests = _result(results), _test_paths(results.get("run", {}).get("args", []))
    elif report_md.is_file():
        result, tests = _from_report_md(report_md.read_text())
    else:
        result, tests = NO_RESULTS, ""
    short = str(commit.get("short", "?"))
    return IndexRow(
        folder=folder.name,
        device=" + ".join(names) + (f" x{gpus}" if gpus > 1 else ""),
        commit=f"{short[:7] if len(short) == 40 else short}{' (dirty)' if commit.get('dirty') else ''}",
        software=f"{software.get('torch', '?')} / {software.get('triton', '?')}",
        started=started[:16].replace("T", " "),
        result=result,
        tests=tests,
        has_report=report_md.is_file(),
    )


def index_rows(root: Path) -> List[IndexRow]:
    """Every report folder directly under ``root``, newest first (ties: by folder name)."""
    rows = [row for folder in root.iterdir() if folder.is_dir() and (row := read_row(folder)) is not None]
    return sorted(rows, key=lambda r: (r.started, r.folder), reverse=True)


def render(rows: Sequence[IndexRow]) -> str:
    """The markdown table of ``rows`` (a line each, header first), ending in a newline."""
    return "\n".join(markdown_table(COLUMNS, [row.cells() for row in rows])) + "\n"


def replace_block(text: str, table: str, where: str = "the file") -> str:
    """``text`` with the lines between :data:`BEGIN` and :data:`END` replaced by ``table``."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError(f"{where} must hold the markers {BEGIN!r} and {END!r} once each, in that order")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table}{END}{tail}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_nsa.report_index", description=__doc__.split("\n")[0])
    parser.add_argument("root", type=Path, help="the folder that holds the report folders")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", type=Path, metavar="FILE", help="replace the marked block of FILE with the table")
    mode.add_argument("--check", type=Path, metavar="FILE", help="exit 1 if the marked block of FILE is not the table")
    args = parser.parse_args(argv)
    if not args.root.is_dir():
        parser.error(f"root: {args.root} is not a folder")
    table = render(index_rows(args.root))
    target = args.write or args.check
    if target is None:
        sys.stdout.write(table)
        return 0
    text = target.read_text()
    try:
        new = replace_block(text, table, str(target))
    except ValueError as err:
        parser.error(str(err))
    if args.check:
        if new != text:
            print(f"{target}: the report index is stale; run python -m pytest_nsa.report_index {args.root} "
                  f"--write {target}", file=sys.stderr)  # fmt: skip
            return 1
        return 0
    target.write_text(new)
    print(f"wrote {target} ({table.count(chr(10)) - 2} reports)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
