"""Transitions of finished rollouts to a file: JSON lines or Parquet (for SFT, offline
RL or analysis). Each row is one ``boltrl.Transition`` under the chosen credit."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from boltrl.credit import CreditConfig, MissingTokenIds, transitions
from boltrl.export.otlp import MissingExtra
from boltrl.records import Rollout, Transition

Format = Literal["jsonl", "parquet"]
_BATCH = 2048


@dataclass
class ExportCounts:
    rollouts: int = 0
    transitions: int = 0
    skipped: int = 0
    """Rollouts left out because a call lacks token ids (boltrl never re-tokenizes)."""


def _transitions(
    rollouts: Iterable[Rollout], credit: CreditConfig, counts: ExportCounts
) -> Iterator[Transition]:
    for r in rollouts:
        try:
            found = transitions(r, credit)
        except MissingTokenIds:
            counts.skipped += 1
            continue
        counts.rollouts += 1
        counts.transitions += len(found)
        yield from found


def _schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("rollout_id", pa.string()),
            ("task_id", pa.string()),
            ("group", pa.string()),
            ("step", pa.int32()),
            ("agent", pa.string()),
            ("state", pa.list_(pa.int32())),
            ("action", pa.list_(pa.int32())),
            ("action_logprobs", pa.list_(pa.float64())),
            ("action_mask", pa.list_(pa.int8())),
            ("reward", pa.float64()),
            ("done", pa.bool_()),
            ("policy_version", pa.int64()),
            ("call_ids", pa.list_(pa.string())),
            ("demonstration", pa.string()),
        ]
    )


def _write_parquet(rows: Iterator[Transition], out: Path) -> None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise MissingExtra(
            "--format parquet needs pyarrow: pip install 'boltrl[parquet]'"
        ) from None
    schema = _schema()
    with pq.ParquetWriter(out, schema) as writer:
        batch: list[dict[str, Any]] = []
        for t in rows:
            batch.append(t.model_dump())
            if len(batch) >= _BATCH:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                batch = []
        if batch:
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))


def write_transitions(
    rollouts: Iterable[Rollout],
    out: str | Path,
    *,
    format: Format = "jsonl",
    credit: CreditConfig | None = None,
) -> ExportCounts:
    """Write the transitions of ``rollouts`` to ``out``; returns what was written.

    Rollouts whose calls lack token ids are skipped and counted.
    """
    cfg = credit or CreditConfig()
    counts = ExportCounts()
    path = Path(out)
    rows = _transitions(rollouts, cfg, counts)
    if format == "parquet":
        _write_parquet(rows, path)
    elif format == "jsonl":
        with path.open("w", encoding="utf-8") as f:
            for t in rows:
                f.write(t.model_dump_json() + "\n")
    else:
        raise ValueError(f"format: expected jsonl or parquet, got {format!r}")
    return counts
