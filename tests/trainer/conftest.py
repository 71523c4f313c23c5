"""Shared fixtures for trainer tests: the tiny random model with the SmolLM2 tokenizer."""

from __future__ import annotations

import os

# Never reach for the hub (this machine class cannot); must be set before transformers loads.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    """A tiny random Llama (2 layers, hidden 64) with SmolLM2's tokenizer and template.

    Built once and cached by content under ``$BOLTRL_CACHE`` (or ``~/.cache/boltrl``).
    """
    from boltrl_trainer.models import tiny_model

    return tiny_model()


@pytest.fixture
def forced(tiny_model_path: Path) -> Iterator[Any]:
    """``forced(script_ids)`` -> a TransformersBackend whose model replies with ``script_ids``
    (one request at a time; see ``backend_util.ForcedReplies``)."""
    from backend_util import ForcedReplies

    replies = ForcedReplies(tiny_model_path)
    yield replies
    replies.close()


@pytest.fixture
def no_backend_errors(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Fail a test if the TransformersBackend logged an error (e.g. a crashed sampling loop
    whose callers were already answered)."""
    yield
    errors = [
        r for r in caplog.records if r.name.startswith("boltrl_trainer") and r.levelname == "ERROR"
    ]
    assert not errors, [r.getMessage() for r in errors]
