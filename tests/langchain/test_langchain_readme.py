"""The README's complete example runs as written and prints what the README says."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).parents[2] / "packages" / "adapter-langchain" / "README.md"


def example() -> str:
    text = README.read_text()
    section = text[text.index("## A complete example") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None
    return match.group(1)


def test_the_readme_example_runs_offline() -> None:
    out = subprocess.run(
        [sys.executable, "-c", example()], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    lines = re.sub(r"chatcmpl-[0-9a-f]+", "chatcmpl-…", out.stdout).splitlines()
    assert [line.split()[:2] for line in lines[:3]] == [
        ["planner", "258"],
        ["planner", "351"],
        ["writer", "186"],
    ]
    assert lines[3:] == [
        "tool add({'a': 2, 'b': 3}) -> '5', asked for by chatcmpl-…",
        "reward 1.0 | unjoined annotations: 0",
    ]
