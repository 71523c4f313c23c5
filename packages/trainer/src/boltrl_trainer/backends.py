"""The backend registry: ``backend: torch | verl`` → one ``seams.BackendKind`` each.

``backend_for(cfg)`` checks the config for its backend (raising ``InvalidInput`` that
names every bad field) and returns the entry; the trainer and ``boltrl eval`` then see
only the seams' protocols. Importing this module starts nothing and imports no torch.
"""

from __future__ import annotations

from pathlib import Path

from boltrl.errors import InvalidInput
from boltrl_trainer.algorithms import make_config
from boltrl_trainer.config import TrainConfig
from boltrl_trainer.policy import load_policy, serve_for_eval, serve_policy
from boltrl_trainer.seams import BackendKind, PolicyServer, TrainingBackend
from boltrl_trainer.update import TorchTrainingBackend
from boltrl_trainer.verl.config import raise_if_invalid
from boltrl_trainer.verl.entry import VerlBackend

__all__ = ["BACKENDS", "TorchBackend", "backend_for"]


class TorchBackend:
    """``backend: torch``: one process, CPU or one GPU; the model it trains is the very
    object its ``TransformersBackend`` serves."""

    name = "torch"

    def check(self, cfg: TrainConfig) -> None:
        raise_if_invalid(cfg)  # a ``verl:`` section under backend torch would be ignored

    def build(self, cfg: TrainConfig) -> tuple[PolicyServer, TrainingBackend]:
        model, tok = load_policy(cfg)
        server = serve_policy(cfg, model, tok)
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        try:
            algo = make_config(cfg.algorithm, cfg.algo)
            return server, TorchTrainingBackend(model, algo, cfg.optim, pad_id=int(pad))
        except BaseException:
            server.close()
            raise

    def serve(self, cfg: TrainConfig, checkpoint: Path | None = None) -> PolicyServer:
        return serve_for_eval(cfg, checkpoint)


BACKENDS: dict[str, BackendKind] = {"torch": TorchBackend(), "verl": VerlBackend()}
"""Every training backend by the name ``TrainConfig.backend`` gives."""


def backend_for(cfg: TrainConfig) -> BackendKind:
    """The registry entry of ``cfg.backend``, after its ``check`` passed."""
    kind = BACKENDS.get(cfg.backend)
    if kind is None:
        raise InvalidInput(f"backend: {cfg.backend!r} is not one of {', '.join(BACKENDS)}")
    kind.check(cfg)
    return kind
