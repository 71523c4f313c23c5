"""The served policy and the candidate the learner trains beside it (torch backend).

``boltrl serve`` serves one model and trains a candidate copy of its trainable weights
(``TorchTrainingBackend.use_separate_copy``: the copy shares every frozen weight with
the served model, so with LoRA it costs the adapters, with a full fine-tune one more
copy of the model):

- the **served** model is behind the live gateway (``server``): users' calls never wait
  for training; its weights change only in ``promote`` (``seams.promote_swap``: under
  ``paused()``, calls in flight finish on the old version, the next ones run the new
  one and are recorded with its ``policy_version``);
- the **candidate** is what ``train`` updates and ``gate_server`` serves, to the gate
  only.

``promote`` also writes the served weights, the optimizer state and the version to
``{out_dir}/served/`` (a fresh folder renamed into place: a crash leaves the previous
one whole); ``reset`` throws the candidate away (weights, optimizer state and version
back to the last promotion's). On start, ``{out_dir}/served/`` (when present) is what
is served: a restart carries on from the last promoted version. Versions count
promotions: a rejected candidate's number goes to the next candidate.
"""

from __future__ import annotations

import json
import logging
import shutil

from boltrl_trainer.policy import load_policy, serve_policy
from boltrl_trainer.seams import TrainBatch, promote_swap, weight_swap
from boltrl_trainer.serve_config import ServeConfig
from boltrl_trainer.serving import TransformersBackend
from boltrl_trainer.update import TorchTrainingBackend

log = logging.getLogger(__name__)

__all__ = ["CandidatePolicy"]

_VERSION_FILE = "policy.json"


class CandidatePolicy:
    """The served model and its trained copy (module docstring). Not thread-safe
    (the learner's thread), except that ``server`` serves live calls meanwhile."""

    def __init__(self, cfg: ServeConfig) -> None:
        self.dir = cfg.out_dir / "served"
        model, tok = load_policy(cfg.train)
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.server: TransformersBackend = serve_policy(cfg.train, model, tok)
        try:
            self.trainer = TorchTrainingBackend(model, cfg.algo, cfg.train.optim, pad_id=int(pad))
            self.trainer.use_separate_copy(resettable=True)
            self.gate_server: TransformersBackend = serve_policy(cfg.train, self.trainer.model, tok)
        except BaseException:
            self.server.close()
            raise
        old = self.dir.with_name(self.dir.name + ".old")
        if not self.dir.exists() and old.exists():  # a crash between _save's two renames
            old.rename(self.dir)
        if (self.dir / _VERSION_FILE).is_file():
            version = int(json.loads((self.dir / _VERSION_FILE).read_text())["version"])
            with weight_swap(self.server, self.trainer):  # loads the served weights too
                self.trainer.load(self.dir, policy_version=version)
            self.gate_server.set_policy_version(version)
            log.info("serving version %d from %s", version, self.dir)
        else:
            self._save()

    @property
    def served_version(self) -> int:
        """The version live calls are served (and recorded) with."""
        return self.trainer.served_version

    @property
    def candidate_version(self) -> int:
        return self.trainer.policy_version

    def train(self, batch: TrainBatch) -> dict[str, float]:
        """Update the candidate (the served model is untouched); returns the metrics."""
        metrics = self.trainer.update(batch)
        self.gate_server.set_policy_version(self.trainer.policy_version)
        return metrics

    def promote(self) -> int:
        """Serve the candidate from now on (and save it); returns its version."""
        version = promote_swap(self.server, self.trainer)
        self._save()
        return version

    def reset(self) -> None:
        """Discard the candidate: back to the served weights, optimizer state, version."""
        self.trainer.reset()
        self.gate_server.set_policy_version(self.trainer.policy_version)

    def close(self) -> None:
        self.server.close()
        self.gate_server.close()
        self.trainer.close()

    def _save(self) -> None:
        tmp = self.dir.with_name(self.dir.name + ".tmp")
        old = self.dir.with_name(self.dir.name + ".old")
        shutil.rmtree(tmp, ignore_errors=True)
        self.trainer.save(tmp)  # the candidate equals the served weights here
        (tmp / _VERSION_FILE).write_text(json.dumps({"version": self.served_version}))
        shutil.rmtree(old, ignore_errors=True)
        if self.dir.exists():
            self.dir.rename(old)
        tmp.rename(self.dir)
        shutil.rmtree(old, ignore_errors=True)
