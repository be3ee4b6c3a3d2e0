"""The benchmark section of the report: tables against the stored baseline, and plots.

No pytest import here. Placeholder until the benchmarks module lands.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence

#: The pytest-benchmark JSON of the run, inside the report folder.
JSON_FILE = "benchmarks.json"


def section(output_json: Optional[Mapping[str, Any]], outcomes: Sequence[Any], state: Any, folder: Path,
            workers: int) -> Dict[str, Any]:
    benches = list((output_json or {}).get("benchmarks", []))
    return {
        "status": "measured" if benches else "none",
        "note": "no benchmark data",
        "count": len(benches),
        "json_file": JSON_FILE if output_json is not None else None,
        "unit": "s",
        "baseline": None,
        "tables": {"decode": [], "prefill": [], "other": []},
        "plots": [],
        "plots_missing": [],
    }
