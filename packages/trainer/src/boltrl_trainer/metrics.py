"""Training metrics: JSONL (one object per line), TensorBoard event files, a PNG plot."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class MetricsWriter:
    """Appends ``{"step": n, "time": t, **metrics}`` to ``metrics.jsonl`` and mirrors
    numeric values to TensorBoard under ``tensorboard/``. Not thread-safe (the training
    loop writes from one thread)."""

    def __init__(self, out_dir: str | Path, *, tensorboard: bool = True) -> None:
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "metrics.jsonl"
        self._fh = self.path.open("a", encoding="utf-8")
        self._tb: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(log_dir=str(self.dir / "tensorboard"))
            except Exception as e:  # tensorboard missing or broken: JSONL still works
                log.warning("TensorBoard logging disabled: %s", e)

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        row = {"step": step, "time": time.time(), **metrics}
        self._fh.write(json.dumps(row, default=float) + "\n")
        self._fh.flush()
        if self._tb is not None:
            for k, v in metrics.items():
                if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
                    self._tb.add_scalar(k, v, step)
            self._tb.flush()

    def close(self) -> None:
        self._fh.close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None


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
