"""The README's complete example runs as printed (in a fresh interpreter: it sets the
SDK's global trace processors) and prints what the README says it prints."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).parents[2] / "packages" / "adapter-openai-agents" / "README.md"


def test_the_readme_example_runs_and_prints_what_it_shows() -> None:
    text = README.read_text()
    example = text[text.index("## A complete example") :]
    code, shown = re.findall(r"```(?:python)?\n(.*?)```", example, re.S)[:2]
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    # "…" in the README stands for the rest of an id
    pattern = r"\w+".join(re.escape(part) for part in shown.split("…"))
    assert re.fullmatch(pattern, out), out
