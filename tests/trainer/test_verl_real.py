"""The verl conversion and config against a real verl 0.9 (CPU torch is enough).

verl is never installed in the workspace (see packages/trainer/requirements-gpu.txt),
so these checks run ``verl_contract.py`` with the Python of a separate virtual
environment, and only where one exists (``$BOLTRL_VERL_PYTHON``, default
``/tmp/verlvenv/bin/python``). To make one (about 2 GB):

    python3 -m venv /tmp/verlvenv
    /tmp/verlvenv/bin/pip install torch==2.13.0 "verl>=0.9,<0.10" cachetools fastapi \
        uvicorn msgspec pyzmq

What it checks: boltrl's settings compose into verl's own ``ppo_trainer`` config (every
key exists), pass ``validate_config`` and build verl's dataclasses; the ``DataProto``
is consistent and verl's own unpadding gives back the exact token ids; verl's GRPO over
``uid`` groups equals boltrl's GRPO; verl's token-mean loss on the scaled advantages
equals boltrl's rollout-normalized loss.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTHON = Path(os.environ.get("BOLTRL_VERL_PYTHON", "/tmp/verlvenv/bin/python"))

pytestmark = pytest.mark.skipif(
    not PYTHON.exists(), reason=f"no verl environment at {PYTHON} (see this module's doc)"
)


def test_conversion_and_config_hold_against_real_verl() -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(ROOT / "packages/core/src"), str(ROOT / "packages/trainer/src")]
        ),
        "HF_HUB_OFFLINE": "1",
        "RAY_DEDUP_LOGS": "0",
    }
    proc = subprocess.run(
        [str(PYTHON), str(ROOT / "tests/trainer/verl_contract.py")],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    passed = [ln for ln in proc.stdout.splitlines() if ln.startswith("OK ")]
    assert len(passed) == 4, proc.stdout
