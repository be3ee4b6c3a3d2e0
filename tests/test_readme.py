"""The README's quick-start example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_quick_start_runs() -> None:
    """Every python block under 'Quick start', in turn in one namespace (a later block uses an
    earlier one's layer); each stays short."""
    text = README.read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) >= 2, "README's 'Quick start' lost a python block"
    namespace = {"__name__": "readme"}
    for code in blocks:
        assert len(code.strip().splitlines()) <= 12
        exec(compile(code, str(README), "exec"), namespace)
