"""``boltrl dashboard``: serve the live dashboard of a store."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from boltrl._serving import env_token
from boltrl.cli import Commands
from boltrl.errors import BoltrlError


def register(commands: Commands) -> None:
    commands.add("dashboard", "serve the live dashboard of a store", _add_arguments, _run)


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--store",
        required=True,
        help="store URL: sqlite:///path.db (read directly, read-only: a trainer may hold "
        "it) or http://host:port (a served store)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=4748, help="port (default 4748; 0 = any free)")
    p.add_argument(
        "--token",
        default=os.environ.get("BOLTRL_DASHBOARD_TOKEN"),
        help="token the browser must present (open the page once with ?token=T); required "
        "off loopback (default: $BOLTRL_DASHBOARD_TOKEN)",
    )
    p.add_argument(
        "--store-token",
        default=env_token(),
        help="bearer token of a served store (default: $BOLTRL_STORE_TOKEN, else $BOLTRL_TOKEN)",
    )
    p.add_argument(
        "--tokenizer",
        default=None,
        help="Hugging Face tokenizer name or path to decode response tokens with "
        "(needs transformers); without it the token view shows ids",
    )
    p.add_argument(
        "--promotions",
        default=None,
        metavar="PATH",
        help="a boltrl serve decision log (OUT_DIR/promotions.jsonl) for the Promotions page",
    )
    p.add_argument(
        "--otlp",
        default=None,
        metavar="ENDPOINT",
        help="also export each rollout that finishes to this OTLP/HTTP endpoint "
        "(needs boltrl[otel])",
    )


def _run(args: argparse.Namespace) -> int:
    from boltrl._serving import bind, check_exposure, local_hosts, serve_forever, url_of
    from boltrl.dashboard import create_dashboard_app, open_source

    try:
        check_exposure(args.host, args.token)
        source, store = open_source(args.store, args.store_token)
    except BoltrlError as e:
        print(f"boltrl dashboard: {e}", file=sys.stderr)
        return 2
    follower: Any = None
    try:
        if args.otlp:
            from boltrl.export.follow import OtlpFollower

            follower = OtlpFollower(source, args.otlp).start()
        # Without a token, only pages on this machine's own names may call the API: a
        # page elsewhere whose name was rebound to 127.0.0.1 (DNS rebinding) may not.
        hosts = local_hosts(args.host) if args.token is None else None
        app = create_dashboard_app(
            source,
            args.token,
            tokenizer=args.tokenizer,
            allowed_hosts=hosts,
            promotions=args.promotions,
        )
        dash = app.state.dashboard
        sock = bind(args.host, args.port)
        auth = "?token=…" if args.token else ""
        print(f"boltrl dashboard: {source.label} on {url_of(sock)}/{auth}", flush=True)
        # end the live streams on exit, or shutdown waits for them
        serve_forever(app, sock, log_level="warning", on_exit=dash.close)
        return 0
    except BoltrlError as e:
        print(f"boltrl dashboard: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"boltrl dashboard: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 1
    finally:
        if follower is not None:
            follower.stop()
        source.close()
        if store is not None:
            store.close()
