"""Training metrics: to the configured trackers (JSONL, TensorBoard, W&B, MLflow), and a PNG
plot of the rewards."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from boltrl_trainer.trackers import DEFAULT_REPORT_TO, TrackerName, make_trackers

log = logging.getLogger(__name__)


class MetricsWriter:
    """Sends ``write(step, metrics)`` to the configured trackers (``boltrl_trainer.trackers``):
    by default ``metrics.jsonl`` and TensorBoard under ``tensorboard/``.

    ``report_to`` names the trackers (default ``jsonl`` + ``tensorboard``, or ``jsonl``
    alone with ``tensorboard=False``); ``config`` and ``lineage`` go to each tracker once,
    at construction. Raises ``InvalidInput`` when a named tracker's package is missing. Not
    thread-safe (the training loop writes from one thread).
    """

    def __init__(
        self,
        out_dir: str | Path,
        *,
        tensorboard: bool = True,
        report_to: Sequence[TrackerName] | None = None,
        run_name: str | None = None,
        config: dict[str, Any] | None = None,
        lineage: dict[str, Any] | None = None,
    ) -> None:
        self._t0 = time.perf_counter()
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "metrics.jsonl"
        if report_to is None:
            report_to = DEFAULT_REPORT_TO if tensorboard else ("jsonl",)
        self.trackers = make_trackers(tuple(report_to), self.dir, run_name or self.dir.name)
        try:
            for tracker in self.trackers:
                tracker.start(config or {}, lineage or {})
        except BaseException:
            self.close()
            raise

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        """Log ``metrics`` at ``step``, with ``time/elapsed_s``: seconds since this writer
        was made (the run's start, after the model loaded), to plot against wall time."""
        row = {**metrics, "time/elapsed_s": time.perf_counter() - self._t0}
        for tracker in self.trackers:
            tracker.log(step, row)

    def close(self) -> None:
        for tracker in self.trackers:
            try:
                tracker.close()
            except Exception as e:  # one tracker's failure must not lose the others' data
                log.warning("closing %s failed: %s", type(tracker).__name__, e)
        self.trackers = []


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a ``metrics.jsonl``."""
    rows = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            rows.append(json.loads(line))
    return rows


def plot_rewards(metrics_path: str | Path, png_path: str | Path, *, title: str = "") -> Path:
    """Plot train reward (mean ± std) and val reward against step into a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
    train = [r for r in rows if "train/reward_mean" in r]
    val = [r for r in rows if "val/reward_mean" in r]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    if train:
        xs = [r["step"] for r in train]
        mu = [r["train/reward_mean"] for r in train]
        sd = [r.get("train/reward_std", 0.0) for r in train]
        ax.plot(xs, mu, label="train reward (mean)", color="tab:blue")
        ax.fill_between(
            xs,
            [m - s for m, s in zip(mu, sd, strict=True)],
            [m + s for m, s in zip(mu, sd, strict=True)],
            color="tab:blue",
            alpha=0.15,
            label="train ± std",
        )
    if val:
        ax.plot(
            [r["step"] for r in val],
            [r["val/reward_mean"] for r in val],
            marker="o",
            label="val reward (temperature 0)",
            color="tab:orange",
        )
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_title(title or "boltrl training")
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    out = Path(png_path)
    fig.savefig(out)
    plt.close(fig)
    return out
