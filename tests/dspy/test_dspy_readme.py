"""The README's complete example runs as written, offline, and prints what it says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).parents[2] / "packages" / "adapter-dspy" / "README.md"


def example() -> str:
    text = README.read_text()
    section = text[text.index("## A complete example") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None
    return match.group(1)


def test_the_readme_example_runs_offline(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "LITELLM_LOCAL_MODEL_COST_MAP"}
    env["DSPY_CACHEDIR"] = str(tmp_path)  # the example sets the offline switch itself
    out = subprocess.run(
        [sys.executable, "-c", example()], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr
    assert "refresh" not in out.stderr  # no model-metadata download was attempted
    lines = re.sub(r"chatcmpl-[0-9a-f]+", "chatcmpl-…", out.stdout).splitlines()
    assert [line.split()[0] for line in lines[:4]] == [
        "solve.react",
        "solve.react",
        "solve.extract.predict",
        "check",
    ]
    assert lines[4:] == [
        "tool add({'a': 2, 'b': 3}) -> 5, chosen by chatcmpl-…",
        "tool finish({}) -> 'Completed.', chosen by chatcmpl-…",
        "reward 1.0 | unjoined annotations: 0",
    ]
