"""``boltrl store serve``: serve a SQLite store over HTTP for runners elsewhere."""

from __future__ import annotations

import argparse
import os
import sys

from boltrl.cli import Commands
from boltrl.errors import BoltrlError


def register(commands: Commands) -> None:
    commands.add("store", "run the rollout store server", _add_arguments, _run)


def _add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="store_action", metavar="ACTION", required=True)
    serve = sub.add_parser(
        "serve",
        help="serve a store over HTTP",
        description="Serve a rollout store over HTTP; runners connect with "
        "--store http://HOST:PORT. Binds 127.0.0.1 unless told otherwise; any other "
        "address requires a token.",
    )
    serve.add_argument(
        "--db",
        required=True,
        help="SQLite file to serve (created if missing), or memory:// for a throwaway store",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=4747, help="port (default 4747; 0 = any free)")
    serve.add_argument(
        "--token",
        default=os.environ.get("BOLTRL_TOKEN"),
        help="bearer token clients must send (default: $BOLTRL_TOKEN); required off loopback",
    )
    serve.add_argument(
        "--max-body-mb",
        type=float,
        default=64.0,
        help="largest request body accepted, in MiB (default 64; larger ones get a 413)",
    )
    serve.add_argument(
        "--synchronous",
        default="NORMAL",
        choices=["NORMAL", "FULL"],
        help="SQLite fsync policy: NORMAL survives process crashes, FULL also power loss",
    )
    serve.add_argument(
        "--otlp",
        metavar="ENDPOINT",
        default=None,
        help="export each rollout as an OpenTelemetry trace to this OTLP/HTTP endpoint when "
        "it finishes (needs boltrl[otel])",
    )


def _run(args: argparse.Namespace) -> int:
    # Imported here: the server pulls in FastAPI/uvicorn, which other commands don't need.
    from boltrl._serving import check_exposure
    from boltrl.store import MemoryStore, SqliteStore, Store
    from boltrl.store.server import serve

    try:
        check_exposure(args.host, args.token)
        store: Store
        if args.db == "memory://":
            store = MemoryStore()
        else:
            store = SqliteStore(args.db, synchronous=args.synchronous)
    except BoltrlError as e:
        print(f"boltrl store serve: {e}", file=sys.stderr)
        return 2

    follower = None
    try:
        if args.otlp:  # live OpenTelemetry export (boltrl.export)
            from boltrl.export.follow import follow_store

            follower = follow_store(store, args.otlp)
    except BoltrlError as e:
        print(f"boltrl store serve: {e}", file=sys.stderr)
        store.close()
        return 2

    def ready(url: str) -> None:
        auth = " (token required)" if args.token else ""
        print(f"boltrl store: serving {args.db} on {url}{auth}", flush=True)

    try:
        serve(
            store,
            host=args.host,
            port=args.port,
            token=args.token,
            on_ready=ready,
            max_body_bytes=int(args.max_body_mb * 2**20),
        )
    except OSError as e:
        print(f"boltrl store serve: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 1
    finally:
        if follower is not None:
            follower.stop()
        store.close()
    return 0
