"""Exports of what the store recorded: OpenTelemetry traces (GenAI conventions, over
OTLP/HTTP; the ``otel`` extra) and transitions as JSON lines or Parquet (``parquet``
extra). ``boltrl export`` is the command line."""

from __future__ import annotations

from boltrl.export.follow import OtlpFollower, finished_heads, rollouts_of
from boltrl.export.otlp import MissingExtra, OtlpExporter, rollout_spans, traces_endpoint
from boltrl.export.transitions import ExportCounts, write_transitions

__all__ = [
    "ExportCounts",
    "MissingExtra",
    "OtlpExporter",
    "OtlpFollower",
    "finished_heads",
    "rollout_spans",
    "rollouts_of",
    "traces_endpoint",
    "write_transitions",
]
