"""DSPy tests stay offline and never touch the user's cache.

``LITELLM_LOCAL_MODEL_COST_MAP`` keeps DSPy from fetching model metadata on its first
call (it must be set before DSPy is imported); each test gets a fresh on-disk cache.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

import dspy
import pytest


@pytest.fixture(autouse=True)
def fresh_dspy_cache(tmp_path: Path) -> Iterator[Path]:
    # read without building DSPy's default cache (in the home directory) on the way
    before = vars(dspy).get("cache")
    dspy.configure_cache(disk_cache_dir=str(tmp_path / "dspy-cache"))
    try:
        yield tmp_path / "dspy-cache"
    finally:
        if before is None:
            del dspy.cache
        else:
            dspy.cache = before
