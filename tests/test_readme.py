"""The README's quick-start example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_quick_start_runs() -> None:
    text = README.read_text()
    section = text.split("## Quick start", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None, "README has no python block under 'Quick start'"
    code = block.group(1)
    assert len(code.strip().splitlines()) <= 12
    exec(compile(code, str(README), "exec"), {"__name__": "readme"})
