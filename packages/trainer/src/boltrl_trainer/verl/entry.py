"""The ``verl`` entry of the backend registry (``boltrl_trainer.backends``).

``check`` refuses settings that would do nothing under verl (``verl.config.check``) and
an environment without the GPU stack; ``build`` starts Ray, verl's workers and its vLLM
servers; ``serve`` evaluates the configured (Hugging Face) model in-process, as the
torch backend does, since evaluation needs no cluster.
"""

from __future__ import annotations

from pathlib import Path

from boltrl_trainer.config import TrainConfig
from boltrl_trainer.policy import serve_for_eval
from boltrl_trainer.seams import PolicyServer, TrainingBackend
from boltrl_trainer.verl import require_verl
from boltrl_trainer.verl.backend import build_verl
from boltrl_trainer.verl.config import raise_if_invalid

__all__ = ["VerlBackend"]


class VerlBackend:
    """``backend: verl``: verl's FSDP actor on Ray, rollouts served by its vLLM servers."""

    name = "verl"

    def check(self, cfg: TrainConfig) -> None:
        raise_if_invalid(cfg)  # the config's own problems first: they are fixed in the file
        require_verl()

    def build(self, cfg: TrainConfig) -> tuple[PolicyServer, TrainingBackend]:
        return build_verl(cfg)

    def serve(self, cfg: TrainConfig, checkpoint: Path | None = None) -> PolicyServer:
        return serve_for_eval(cfg, checkpoint)
