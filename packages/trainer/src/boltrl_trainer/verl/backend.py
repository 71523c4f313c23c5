"""``VerlTrainingBackend``: boltrl's ``TrainingBackend`` on verl (FSDP actor + vLLM on Ray).

setup: compose verl's ``ppo_trainer.yaml`` with boltrl's settings (``verl.config``) →
       Ray → verl's worker groups (FSDP actor, reference when a KL penalty is on) and its
       vLLM servers (one per replica, colocated with the actor: verl's hybrid engine) →
       the initial weights are synced into vLLM → ``ReplicaPool`` serves the gateway.
update: transitions → ``DataProto`` (``verl.convert``) → the vLLM engines sleep (their
       memory goes to training) → old logprobs (recomputed, or the sampler's) →
       reference logprobs → advantages (boltrl's, or verl's estimator) → one PPO
       mini-batch per epoch → the new weights sync into vLLM, which wakes →
       policy version + 1.

verl is driven through ``RayPPOTrainer``'s worker setup and its per-stage methods (the
same calls its own ``fit`` makes); the only subclassing is ``_create_dataloader``,
because boltrl, not a verl dataset, supplies the data. Needs verl 0.9.x, vLLM and CUDA.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from boltrl.errors import InvalidInput
from boltrl_trainer.algorithms import make_config
from boltrl_trainer.config import TrainConfig
from boltrl_trainer.seams import TrainBatch
from boltrl_trainer.verl import require_verl
from boltrl_trainer.verl.config import raise_if_invalid, row_multiple, verl_overrides
from boltrl_trainer.verl.convert import metrics_from_verl, to_dataproto, transitions_to_verl
from boltrl_trainer.verl.rollout import ReplicaPool, served_model
from boltrl_trainer.verl.settings import VerlConfig

log = logging.getLogger(__name__)

__all__ = ["VerlTrainingBackend", "build_verl", "compose_verl_config"]


def compose_verl_config(overrides: dict[str, Any]) -> Any:
    """verl's own ``ppo_trainer`` config with ``overrides`` (dotted keys) applied.

    The config is in struct mode while they are applied, so a key verl does not have
    raises ``InvalidInput`` naming it instead of being silently added.
    """
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_module("verl.trainer.config", version_base=None):
        config = compose(config_name="ppo_trainer")
    OmegaConf.set_struct(config, True)
    for key, value in overrides.items():
        try:
            OmegaConf.update(config, key, value, merge=False)
        except (ConfigAttributeError, ConfigKeyError) as e:
            raise InvalidInput(
                f"verl: {key!r} is not a setting of verl's ppo_trainer config ({e}); check "
                "the key against verl 0.9's ppo_trainer.yaml"
            ) from None
    return config


def _trainer_class() -> type[Any]:
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    class BoltrlPPOTrainer(RayPPOTrainer):  # type: ignore[misc]
        """verl's trainer without its dataset: boltrl's rollouts are the data."""

        def _create_dataloader(self, *args: Any, **kwargs: Any) -> None:
            from omegaconf import open_dict

            self.train_dataset = self.val_dataset = None
            self.total_training_steps = int(self.config.trainer.total_training_steps)
            with open_dict(self.config):
                self.config.actor_rollout_ref.actor.optim.total_training_steps = (
                    self.total_training_steps
                )

    return BoltrlPPOTrainer


class VerlTrainingBackend:
    """``boltrl_trainer.seams.TrainingBackend`` on verl. Build with ``build_verl(cfg)``.

    Promises (as ``TrainingBackend``): ``update`` blocks until the new weights serve
    in vLLM; the caller holds the ``ReplicaPool`` paused around it
    (``seams.weight_swap``). Not thread-safe.
    """

    def __init__(self, cfg: TrainConfig, *, version: int = 0) -> None:
        require_verl()
        raise_if_invalid(cfg)
        import ray
        from omegaconf import OmegaConf
        from verl.trainer.constants_ppo import get_ppo_ray_runtime_env
        from verl.trainer.main_ppo_v0 import BaseTaskRunner
        from verl.trainer.ppo.utils import need_critic, need_reference_policy
        from verl.utils.config import omega_conf_to_dataclass, validate_config
        from verl.workers.config import HFModelConfig

        self.cfg = cfg
        self.vcfg = cfg.verl or VerlConfig()
        self.algo = make_config(cfg.algorithm, cfg.algo)
        self._version = version
        self.config = compose_verl_config(verl_overrides(cfg))
        OmegaConf.resolve(self.config)
        self._started_ray = not ray.is_initialized()
        if self._started_ray:
            ray.init(
                address=self.vcfg.ray_address, runtime_env=get_ppo_ray_runtime_env(self.config)
            )
        runner = BaseTaskRunner()  # verl's own role → worker → GPU pool wiring
        _, worker_group_cls = runner.add_actor_rollout_worker(self.config)
        runner.add_reward_model_resource_pool(self.config)
        validate_config(
            config=self.config,
            use_reference_policy=need_reference_policy(self.config),
            use_critic=need_critic(self.config),
        )
        model: HFModelConfig = omega_conf_to_dataclass(self.config.actor_rollout_ref.model)
        tok = model.tokenizer
        self.pad_id = int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
        self.trainer = _trainer_class()(
            config=self.config,
            tokenizer=tok,
            processor=model.processor,
            role_worker_mapping=runner.role_worker_mapping,
            resource_pool_manager=runner.init_resource_pool_mgr(self.config),
            ray_worker_group_cls=worker_group_cls,
        )
        t0 = time.perf_counter()
        self.trainer.init_workers()  # actor (+ref) workers, vLLM servers (asleep)
        self.trainer.checkpoint_manager.update_weights(version)  # load_format is dummy
        log.info("verl workers and vLLM servers ready in %.1fs", time.perf_counter() - t0)

    @property
    def policy_version(self) -> int:
        return self._version

    @property
    def server_urls(self) -> list[str]:
        """OpenAI base URL of each vLLM replica."""
        return [f"http://{a}/v1" for a in self.trainer.llm_server_manager.server_addresses]

    def update(self, batch: TrainBatch) -> dict[str, float]:
        """One PPO update (``optim.epochs`` passes, one mini-batch each) and a weight sync."""
        from omegaconf import open_dict
        from verl.utils.metric import reduce_metrics

        t0 = time.perf_counter()
        if not batch.transitions:
            return {"update/skipped": 1.0}
        own_advantages = self.vcfg.advantages == "boltrl"
        vb = transitions_to_verl(
            batch.transitions,
            batch.advantages if own_advantages else None,
            pad_id=self.pad_id,
            multiple=row_multiple(self.cfg),
            normalization=self.algo.loss_normalization,
            temperature=batch.temperature,
        )
        self._check_lengths(vb.tensors["attention_mask"])
        data = to_dataproto(vb)
        trainer = self.trainer
        metrics: dict[str, float] = {}
        trainer.checkpoint_manager.sleep_replicas()  # vLLM's GPU memory goes to training
        if self.config.trainer.balance_batch:
            balance: dict[str, Any] = {}
            trainer._balance_batch(data, metrics=balance)
            metrics.update({f"verl/{k}": float(v) for k, v in balance.items()})
        data.meta_info["global_token_num"] = data.batch["attention_mask"].sum(-1).tolist()
        data = self._old_logprobs(data, metrics)
        if trainer.use_reference_policy:
            data = data.union(trainer._compute_ref_log_prob(data))
        if not own_advantages:
            data = self._verl_advantages(data)
        data.batch.pop("advantage_scale")
        with open_dict(self.config):  # one mini-batch per epoch: the whole (padded) batch
            self.config.actor_rollout_ref.actor.ppo_mini_batch_size = len(data)
        out = trainer._update_actor(data)
        trainer.checkpoint_manager.update_weights(self._version + 1)  # sync, wake vLLM
        self._version += 1
        metrics.update(metrics_from_verl(reduce_metrics(out.meta_info["metrics"])))
        metrics["update/rows"] = float(vb.real_rows)
        metrics["update/pad_rows"] = float(vb.pad_rows)
        metrics["update/tokens"] = float(vb.tensors["response_mask"].sum())
        metrics["time/update_s"] = time.perf_counter() - t0
        return metrics

    def _old_logprobs(self, data: Any, metrics: dict[str, float]) -> Any:
        """``old_log_probs``: the sampler's, or recomputed by the actor (then also the
        entropy and the sampler/trainer logprob gap, as the torch backend reports)."""
        import torch

        if self.vcfg.old_logprobs == "rollout":
            data.batch["old_log_probs"] = data.batch["rollout_log_probs"].clone()
            return data
        old, _ = self.trainer._compute_old_log_prob(data)
        entropy = old.batch.pop("entropys")
        data = data.union(old)
        mask = data.batch["response_mask"].to(torch.float32)
        tokens = mask.sum().clamp(min=1)
        gap = (data.batch["old_log_probs"] - data.batch["rollout_log_probs"]).abs()
        metrics["update/entropy"] = float((entropy * mask).sum() / tokens)
        metrics["update/logprob_mismatch"] = float((gap * mask).sum() / tokens)
        return data

    def _check_lengths(self, attention_mask: Any) -> None:
        """Packing by tokens cannot split a sequence: refuse one longer than the budget
        here, by name, rather than fail inside a Ray worker."""
        longest = int(attention_mask.sum(-1).max())
        if self.vcfg.micro_batch_size_per_gpu is None and longest > self.cfg.optim.token_budget:
            raise InvalidInput(
                f"optim.token_budget: {self.cfg.optim.token_budget} tokens per GPU cannot hold "
                f"a {longest}-token transition (prompt + response); raise it to at least "
                f"{longest}, or set verl.micro_batch_size_per_gpu"
            )

    def _verl_advantages(self, data: Any) -> Any:
        """verl's estimator on the rewards at each response's last token, by ``uid``; then
        the rollout-normalization scale (see ``verl.convert``) per row."""
        from verl.trainer.ppo.ray_trainer import compute_advantage

        data = compute_advantage(
            data,
            adv_estimator=self.config.algorithm.adv_estimator,
            gamma=self.config.algorithm.gamma,
            lam=self.config.algorithm.lam,
            num_repeat=1,
            norm_adv_by_std_in_grpo=self.config.algorithm.norm_adv_by_std_in_grpo,
            config=self.config.algorithm,
        )
        scale = data.batch["advantage_scale"][:, None]
        data.batch["advantages"] = data.batch["advantages"] * scale
        data.batch["returns"] = data.batch["returns"] * scale
        return data

    # -- checkpoints ----------------------------------------------------------------

    def save(self, path: Path) -> None:
        """verl's actor checkpoint (sharded weights, optimizer, scheduler) in ``path/actor``.

        Multi-node: ``path`` must be on storage every node sees.
        """
        self.trainer.actor_rollout_wg.save_checkpoint(
            str(path / "actor"), None, self._version, None
        )

    def load(self, path: Path, *, policy_version: int) -> None:
        """Load ``save``'s checkpoint and sync its weights into vLLM as ``policy_version``."""
        actor = path / "actor"
        if not actor.is_dir():
            raise InvalidInput(f"checkpoint {path} has no verl actor state ({actor} missing)")
        self._version = int(policy_version)
        self.trainer.checkpoint_manager.sleep_replicas()
        self.trainer.actor_rollout_wg.load_checkpoint(str(actor), None, False)
        self.trainer.checkpoint_manager.update_weights(self._version)

    def close(self) -> None:
        """Stop Ray if this backend started it (its workers and vLLM servers go with it)."""
        if self._started_ray:
            import ray

            ray.shutdown()
            self._started_ray = False


def build_verl(cfg: TrainConfig) -> tuple[ReplicaPool, VerlTrainingBackend]:
    """The gateway backend and the training backend of a ``backend: verl`` run."""
    trainer = VerlTrainingBackend(cfg)
    try:
        urls = trainer.server_urls
        pool = ReplicaPool(urls, served_model(urls[0]), policy_version=trainer.policy_version)
    except BaseException:
        trainer.close()
        raise
    log.info("serving rollouts from %d vLLM replica(s): %s", len(urls), ", ".join(urls))
    return pool, trainer
