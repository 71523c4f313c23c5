"""A run's lineage: what its results descend from, logged once to every tracker."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from boltrl_trainer.config import TrainConfig

log = logging.getLogger(__name__)


def run_lineage(cfg: TrainConfig, *, resume: bool = False) -> dict[str, Any]:
    """What a run's results descend from: the model (and ``init_from`` checkpoint), the
    policy version it starts at (a resumed run's latest checkpoint's) and the installed
    boltrl distributions' versions."""
    from boltrl.cli import installed_versions

    version = 0
    latest = Path(cfg.out_dir) / "checkpoints" / "latest"
    if resume and latest.is_file():
        state = latest.parent / latest.read_text().strip() / "state.json"
        try:
            version = int(json.loads(state.read_text())["policy_version"])
        except (OSError, ValueError, KeyError) as e:  # the resume itself will say what broke
            log.debug("no policy version in %s: %s", state, e)
    versions = dict(installed_versions())
    return {
        "model": cfg.model,
        "init_from": getattr(cfg, "init_from", None),
        "policy_version": version,
        "resumed": resume,
        "boltrl_version": versions.get("boltrl"),
        "boltrl_versions": versions,
    }
