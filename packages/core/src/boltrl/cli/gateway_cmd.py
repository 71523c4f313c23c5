"""``boltrl gateway serve``: the gateway standalone, in front of vLLM / SGLang / any
OpenAI-compatible server."""

from __future__ import annotations

import argparse
import os
import signal
import threading
from typing import Any

from boltrl._serving import MAX_BODY_BYTES, check_exposure, env_token
from boltrl.cli import Commands


def _add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="gateway_command", metavar="ACTION", required=True)
    s = sub.add_parser("serve", help="serve an OpenAI-compatible upstream through the gateway")
    s.add_argument(
        "--upstream",
        required=True,
        help="the upstream's OpenAI base URL, e.g. http://127.0.0.1:8000/v1",
    )
    s.add_argument("--model", required=True, help="model name sent upstream and served")
    s.add_argument(
        "--api-key",
        default=os.environ.get("BOLTRL_UPSTREAM_API_KEY"),
        help="upstream API key (default: $BOLTRL_UPSTREAM_API_KEY)",
    )
    s.add_argument(
        "--store",
        default=None,
        help="store URL to record rollout calls in (memory://, sqlite:///PATH, "
        "http://HOST:PORT); without it calls are served, not recorded",
    )
    s.add_argument(
        "--store-token",
        default=env_token(),
        help="bearer token of a served store (default: $BOLTRL_STORE_TOKEN, else $BOLTRL_TOKEN)",
    )
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    s.add_argument(
        "--token",
        default=os.environ.get("BOLTRL_GATEWAY_TOKEN"),
        help="API key clients must send; required off loopback (default: $BOLTRL_GATEWAY_TOKEN)",
    )
    s.add_argument(
        "--max-body-mb",
        type=float,
        default=MAX_BODY_BYTES / 2**20,
        help=f"largest request body accepted, in MiB (default {MAX_BODY_BYTES // 2**20})",
    )
    s.add_argument(
        "--policy-version",
        type=int,
        default=0,
        help="policy version recorded with each call (default 0)",
    )
    s.add_argument(
        "--sessions",
        action="store_true",
        help="also record deployed agents' sessions (/sessions/ID/v1) and take their feedback "
        "(POST /sessions/ID/feedback); needs --store",
    )
    s.add_argument(
        "--feedback-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="with --sessions: a session without feedback this long after its last call "
        "expires and is never trained on (default 3600)",
    )


def _serve(args: argparse.Namespace) -> int:
    from boltrl.gateway import Gateway, SessionConfig
    from boltrl.gateway.upstream import UpstreamBackend

    store: Any = None
    sessions = None
    try:
        check_exposure(args.host, args.token)
        if args.feedback_timeout is not None and not args.sessions:
            raise ValueError("--feedback-timeout: only with --sessions")
        if args.sessions:
            if not args.store:
                raise ValueError("--sessions: needs --store (sessions are recorded there)")
            timeout = args.feedback_timeout
            sessions = SessionConfig() if timeout is None else SessionConfig(timeout)
        if args.store:
            from boltrl.store import open_store

            store = open_store(args.store, token=args.store_token)
    except ValueError as e:
        print(f"boltrl gateway: {e}", flush=True)
        return 2
    backend = UpstreamBackend(
        args.upstream, args.model, args.api_key, policy_version=args.policy_version
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        gateway = Gateway(
            backend,
            store,
            host=args.host,
            port=args.port,
            token=args.token,
            max_body_bytes=int(args.max_body_mb * 2**20),
            sessions=sessions,
        )
    except ValueError as e:
        if store is not None:
            store.close()
        print(f"boltrl gateway: {e}", flush=True)
        return 2
    with gateway:
        print(
            f"boltrl gateway serving {args.model} from {backend.base_url} on {gateway.url}"
            f" (rollout calls: {gateway.url}/rollouts/ROLLOUT_ID/attempts/N/TOKEN/v1)",
            flush=True,
        )
        if sessions is not None:
            print(
                f"sessions: base_url {gateway.url}/sessions/SESSION_ID/v1, feedback POST "
                f"{gateway.url}/sessions/SESSION_ID/feedback within "
                f"{sessions.feedback_timeout_s:g} s of the last call",
                flush=True,
            )
        stop.wait()
    if store is not None:
        store.close()
    print("boltrl gateway stopped", flush=True)
    return 0


def _run(args: argparse.Namespace) -> int:
    if args.gateway_command == "serve":
        return _serve(args)
    return 2  # pragma: no cover - argparse enforces the choice


def register(commands: Commands) -> None:
    """Add ``boltrl gateway`` to the command table."""
    commands.add("gateway", "run the OpenAI-compatible gateway", _add_arguments, _run)
