"""``boltrl export``: rollouts as OpenTelemetry traces (OTLP/HTTP), or their transitions
as JSON lines / Parquet."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from boltrl._serving import env_token
from boltrl.cli import Commands
from boltrl.errors import BoltrlError

if TYPE_CHECKING:
    from boltrl.dashboard.model import Filters, Source


def register(commands: Commands) -> None:
    commands.add(
        "export",
        "export rollouts as OpenTelemetry traces, or transitions as JSONL/Parquet",
        _add_arguments,
        _run,
    )


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", required=True, help="store URL (sqlite:///path.db is read read-only)")
    p.add_argument(
        "--store-token",
        default=env_token(),
        help="bearer token of a served store (default: $BOLTRL_STORE_TOKEN, else $BOLTRL_TOKEN)",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--otlp",
        metavar="ENDPOINT",
        help="OTLP/HTTP endpoint, e.g. http://localhost:4318 (/v1/traces is added when the "
        "URL has no path); needs boltrl[otel]",
    )
    what.add_argument("--format", choices=["jsonl", "parquet"], help="write transitions to --out")
    p.add_argument("--out", help="output file of --format")
    p.add_argument(
        "--status",
        default=None,
        help="comma-separated statuses to export (default: every finished rollout for "
        "--otlp, succeeded for --format)",
    )
    p.add_argument("--run", default=None, help="only rollouts of this run (task.metadata.run)")
    otlp = p.add_argument_group("OpenTelemetry")
    otlp.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="header to send with every export (repeatable), e.g. an API key",
    )
    otlp.add_argument("--service-name", default="boltrl", help="service.name of the traces")
    otlp.add_argument(
        "--no-content",
        action="store_true",
        help="leave out messages, tool arguments and results (gen_ai.input/output.messages…)",
    )
    otlp.add_argument(
        "--follow",
        action="store_true",
        help="after the finished rollouts, keep exporting each one as it finishes (Ctrl-C stops)",
    )
    tr = p.add_argument_group("transitions")
    tr.add_argument("--credit", choices=["final", "discounted"], default="final")
    tr.add_argument("--gamma", type=float, default=1.0, help="discount for --credit discounted")
    tr.add_argument("--agents", default=None, help="comma-separated agents to emit (default: all)")
    tr.add_argument("--merge-prefix", action="store_true", help="merge prefix-extending calls")


def _run(args: argparse.Namespace) -> int:
    from boltrl.dashboard.model import TERMINAL, Filters
    from boltrl.dashboard.source import open_source

    default = TERMINAL if args.otlp else ("succeeded",)
    status = tuple(s for s in (args.status or "").split(",") if s) or default
    bad = [s for s in status if s not in TERMINAL]
    if bad:
        print(
            f"boltrl export: --status: {bad[0]!r} is not a finished status ({', '.join(TERMINAL)})",
            file=sys.stderr,
        )
        return 2
    if args.format and not args.out:
        print("boltrl export: --format needs --out FILE", file=sys.stderr)
        return 2
    filters = Filters(status=status, run=args.run)
    try:
        source, store = open_source(args.store, args.store_token)
    except BoltrlError as e:
        print(f"boltrl export: {e}", file=sys.stderr)
        return 2
    try:
        if args.otlp:
            return _otlp(args, source, filters)
        return _transitions(args, source, filters)
    except BoltrlError as e:
        print(f"boltrl export: {e}", file=sys.stderr)
        return 1
    finally:
        source.close()
        if store is not None:
            store.close()


def _otlp(args: argparse.Namespace, source: Source, filters: Filters) -> int:
    from boltrl.export.follow import OtlpFollower
    from boltrl.export.otlp import OtlpExporter

    headers = {}
    for h in args.header:
        key, sep, value = h.partition("=")
        if not sep:
            print(f"boltrl export: --header {h!r}: expected KEY=VALUE", file=sys.stderr)
            return 2
        headers[key.strip()] = value.strip()
    exporter = OtlpExporter(
        args.otlp, headers=headers, service_name=args.service_name, content=not args.no_content
    )
    follower = OtlpFollower(source, exporter, existing=True, filters=filters)
    try:
        follower.step()
        print(
            f"boltrl export: {follower.exported} rollouts sent to {exporter.endpoint}", flush=True
        )
        if follower.pending and not args.follow:
            print(
                f"boltrl export: {follower.pending} rollouts not sent: {follower.last_error}",
                file=sys.stderr,
            )
            return 1
        if not args.follow:
            return 0
        print("boltrl export: following; Ctrl-C stops", flush=True)
        seen = follower.exported
        while True:
            time.sleep(1.0)
            follower.step()
            if follower.exported != seen:
                seen = follower.exported
                print(f"boltrl export: {seen} rollouts sent", flush=True)
    except KeyboardInterrupt:
        return 0
    finally:
        follower.stop()


def _transitions(args: argparse.Namespace, source: Source, filters: Filters) -> int:
    from boltrl.credit import CreditConfig
    from boltrl.export.follow import finished_heads, rollouts_of
    from boltrl.export.transitions import write_transitions

    agents = tuple(a for a in (args.agents or "").split(",") if a) or None
    credit = CreditConfig(
        mode=args.credit, gamma=args.gamma, agents=agents, merge_prefix=args.merge_prefix
    )
    rollouts = rollouts_of(source, finished_heads(source, filters))
    counts = write_transitions(rollouts, args.out, format=args.format, credit=credit)
    print(
        f"boltrl export: {counts.transitions} transitions of {counts.rollouts} rollouts "
        f"written to {args.out}"
        + (f" ({counts.skipped} rollouts without token ids skipped)" if counts.skipped else ""),
        flush=True,
    )
    return 0
