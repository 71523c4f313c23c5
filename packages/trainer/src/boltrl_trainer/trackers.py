"""Experiment trackers, named as TRL and verl name them: ``report_to: [jsonl, tensorboard,
wandb, mlflow]`` in a train config.

- ``jsonl``: ``out_dir/metrics.jsonl``, one ``{"step", "time", **metrics}`` object a line.
- ``tensorboard``: event files under ``out_dir/tensorboard``.
- ``wandb``: a Weights & Biases run (``pip install wandb``). Project from ``WANDB_PROJECT``
  (default ``boltrl``); offline with ``WANDB_MODE=offline``; files under ``out_dir``.
- ``mlflow``: an MLflow run (``pip install mlflow-skinny``) in the store of
  ``MLFLOW_TRACKING_URI`` (MLflow's default when unset), experiment ``MLFLOW_EXPERIMENT_NAME``
  (default ``boltrl``).

Every tracker receives the run's config and its lineage (model, starting policy version,
installed boltrl versions) once at the start, then each step's metrics; W&B and MLflow
keep the config as the run's config / params and the lineage as config / tags. Trackers
are used from the training loop's one thread; none of them is thread-safe.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

from pydantic import AfterValidator, BeforeValidator

from boltrl.errors import InvalidInput

log = logging.getLogger(__name__)

TrackerName = Literal["jsonl", "tensorboard", "wandb", "mlflow"]
DEFAULT_REPORT_TO: tuple[TrackerName, ...] = ("jsonl", "tensorboard")


def _normalize(value: Any) -> Any:
    # TRL's spellings: one name as a string, "none" for no tracker
    if isinstance(value, str):
        return [] if value == "none" else [value]
    return value


_PACKAGES = {"wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow-skinny")}
"""Tracker -> (module to import, distribution to install)."""


def _installed(names: list[TrackerName]) -> list[TrackerName]:
    # checked when the config is read, so a run never loads its model only to fail here
    for name in names:
        module, dist = _PACKAGES.get(name, (None, None))
        if module is not None and importlib.util.find_spec(module) is None:
            raise ValueError(
                f"{name} is not installed: pip install {dist} "
                f"(or pip install 'boltrl-trainer[{name}]')"
            )
    return names


ReportTo = Annotated[list[TrackerName], BeforeValidator(_normalize), AfterValidator(_installed)]
"""The ``report_to`` config type: a list of tracker names (a single name or ``none`` too);
names a tracker whose package is missing as invalid, with the install command."""


class Tracker(Protocol):
    """Receives a run's config once and its metrics step by step.

    Promises: ``start`` is called once before any ``log``; ``log`` gets numbers, strings and
    lists (a tracker keeps what it can, finite numbers at least); ``close`` flushes and may
    be called once. Errors while logging are the tracker's own to log, never to raise.
    """

    def start(self, config: dict[str, Any], lineage: dict[str, Any]) -> None: ...

    def log(self, step: int, metrics: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def _numbers(metrics: dict[str, Any]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"optim": {"lr": 1e-4}}`` -> ``{"optim.lr": "0.0001"}`` (MLflow params are flat)."""
    out: dict[str, str] = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v if isinstance(v, str) else json.dumps(v)
    return out


class JsonlTracker:
    """Appends ``{"step": n, "time": t, **metrics}`` to ``out_dir/metrics.jsonl``."""

    def __init__(self, out_dir: Path) -> None:
        self.path = out_dir / "metrics.jsonl"
        self._fh = self.path.open("a", encoding="utf-8")

    def start(self, config: dict[str, Any], lineage: dict[str, Any]) -> None:
        pass  # the checkpoint's state.json keeps the config; metrics.jsonl stays rows only

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        row = {"step": step, "time": time.time(), **metrics}
        self._fh.write(json.dumps(row, default=float) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


class TensorBoardTracker:
    """Scalars under ``out_dir/tensorboard``, the config and lineage as a text summary."""

    def __init__(self, out_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._tb = SummaryWriter(log_dir=str(out_dir / "tensorboard"))

    def start(self, config: dict[str, Any], lineage: dict[str, Any]) -> None:
        text = json.dumps({"config": config, "lineage": lineage}, indent=2, default=str)
        self._tb.add_text("run", f"```\n{text}\n```", 0)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        for k, v in _numbers(metrics).items():
            self._tb.add_scalar(k, v, step)
        self._tb.flush()

    def close(self) -> None:
        self._tb.close()


class WandbTracker:
    """A W&B run named after the boltrl run; config = the train config + ``lineage``."""

    def __init__(self, out_dir: Path, run_name: str) -> None:
        try:
            import wandb
        except ImportError:
            raise InvalidInput(
                "report_to: wandb needs the wandb package: pip install wandb "
                "(or pip install 'boltrl-trainer[wandb]')"
            ) from None
        self._wandb = wandb
        self._out_dir = out_dir
        self._run_name = run_name
        self._run: Any = None

    def start(self, config: dict[str, Any], lineage: dict[str, Any]) -> None:
        self._run = self._wandb.init(
            project=os.environ.get("WANDB_PROJECT", "boltrl"),
            name=self._run_name,
            dir=str(self._out_dir),
            config={**config, "lineage": lineage},
            tags=[f"model:{lineage.get('model')}"[:64]],
            reinit="create_new",
        )

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        try:
            self._run.log(_numbers(metrics), step=step)
        except Exception as e:  # a tracker must never stop training
            log.warning("W&B logging failed at step %d: %s", step, e)

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None


def _store_error(uri: str, e: Exception) -> InvalidInput:
    return InvalidInput(
        f"report_to: mlflow could not open its tracking store {uri!r} "
        f"({type(e).__name__}: {str(e).strip()[:300]}); set MLFLOW_TRACKING_URI to your MLflow "
        "server (http://HOST:PORT) or a store this MLflow install supports"
    )


class MlflowTracker:
    """An MLflow run: the train config as params (flattened, dotted keys) and as the
    artifact ``config.json``, the lineage as ``boltrl.*`` tags, metrics per step."""

    def __init__(self, run_name: str) -> None:
        try:
            from mlflow import MlflowClient
        except ImportError:
            raise InvalidInput(
                "report_to: mlflow needs MLflow: pip install mlflow-skinny "
                "(or pip install 'boltrl-trainer[mlflow]')"
            ) from None
        try:
            self._client = MlflowClient()  # MLFLOW_TRACKING_URI, or MLflow's default store
        except Exception as e:
            uri = os.environ.get("MLFLOW_TRACKING_URI", "(MLflow's default)")
            raise _store_error(uri, e) from e
        self._run_name = run_name
        self.run_id: str | None = None

    def start(self, config: dict[str, Any], lineage: dict[str, Any]) -> None:
        from mlflow.entities import Param

        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "boltrl")
        try:
            exp = self._client.get_experiment_by_name(name)
            exp_id = exp.experiment_id if exp is not None else self._client.create_experiment(name)
        except Exception as e:  # e.g. mlflow-skinny cannot open MLflow's default SQLite store
            raise _store_error(self._client.tracking_uri, e) from e
        tags = {
            f"boltrl.{k}": v if isinstance(v, str) else json.dumps(v) for k, v in lineage.items()
        }
        run = self._client.create_run(exp_id, run_name=self._run_name, tags=tags)
        self.run_id = run.info.run_id
        params = [Param(k, v[:6000]) for k, v in sorted(_flatten(config).items())]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params a batch
            self._client.log_batch(self.run_id, params=params[i : i + 100])
        self._client.log_dict(self.run_id, {"config": config, "lineage": lineage}, "config.json")

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        rows = [Metric(k, v, now, step) for k, v in _numbers(metrics).items()]
        try:
            for i in range(0, len(rows), 1000):
                self._client.log_batch(self.run_id or "", metrics=rows[i : i + 1000])
        except Exception as e:  # a tracker must never stop training
            log.warning("MLflow logging failed at step %d: %s", step, e)

    def close(self) -> None:
        if self.run_id is not None:
            self._client.set_terminated(self.run_id)
            self.run_id = None


def make_trackers(
    report_to: list[TrackerName] | tuple[TrackerName, ...], out_dir: Path, run_name: str
) -> list[Tracker]:
    """The trackers ``report_to`` names, in order. Raises ``InvalidInput`` (naming the
    package to install) when W&B or MLflow is asked for and missing. TensorBoard falls back
    to a warning when torch's writer cannot load, as the default should not stop a run."""
    trackers: list[Tracker] = []
    try:
        for name in dict.fromkeys(report_to):  # each once, in order
            trackers.extend(_make(name, out_dir, run_name))
    except BaseException:
        for tracker in trackers:  # nothing left open by a half-made set
            tracker.close()
        raise
    return trackers


def _make(name: str, out_dir: Path, run_name: str) -> list[Tracker]:
    if name == "jsonl":
        return [JsonlTracker(out_dir)]
    if name == "tensorboard":
        try:
            return [TensorBoardTracker(out_dir)]
        except Exception as e:  # tensorboard missing or broken: the others still work
            log.warning("TensorBoard logging disabled: %s", e)
            return []
    if name == "wandb":
        return [WandbTracker(out_dir, run_name)]
    if name == "mlflow":
        return [MlflowTracker(run_name)]
    raise InvalidInput(f"report_to: unknown tracker {name!r} (jsonl, tensorboard, wandb, mlflow)")
