"""``boltrl runner``: run an agent against a (usually remote) store."""

from __future__ import annotations

import argparse

from boltrl._serving import env_token
from boltrl.cli import Commands


def _add(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", required=True, help="store URL: http://host:port, sqlite:///x.db")
    p.add_argument("--agent", required=True, help="the agent: module:function or file.py:function")
    p.add_argument("--concurrency", type=int, default=1, help="rollouts run at once (default 1)")
    p.add_argument(
        "--store-token",
        "--token",
        dest="store_token",
        default=env_token(),
        help="bearer token of a served store (default: $BOLTRL_STORE_TOKEN, else $BOLTRL_TOKEN)",
    )
    p.add_argument("--worker-id", default=None, help="worker id shown in the store")
    p.add_argument("--lease", type=float, default=30.0, help="lease seconds (default 30)")
    p.add_argument("--max-rollouts", type=int, default=None, help="stop after this many")
    p.add_argument("--exit-when-idle", action="store_true", help="exit once no rollout is queued")
    p.add_argument(
        "--isolation",
        choices=("process", "thread"),
        default="process",
        help="run agents in reused worker processes, so a crash fails only its rollout "
        "(default), or in threads of the runner",
    )
    p.add_argument(
        "--default-timeout",
        type=float,
        default=1800.0,
        help="seconds a rollout enqueued without timeout_s may run (default 1800)",
    )
    p.add_argument(
        "--worker-memory-mb",
        type=int,
        default=None,
        help="cap each agent worker's address space (process isolation): a memory blow-up "
        "fails its rollout with MemoryError",
    )


def _run(args: argparse.Namespace) -> int:
    from boltrl.errors import BoltrlError
    from boltrl.loading import load_object
    from boltrl.runner import Runner, freeze_long_lived
    from boltrl.store import open_store

    try:
        # With processes the agent is imported in the workers only (prestart checks it).
        agent = (
            args.agent if args.isolation == "process" else load_object(args.agent, what="--agent")
        )
        store = open_store(args.store, token=args.store_token)
    except BoltrlError as e:
        print(f"boltrl runner: {e}")
        return 2
    runner = Runner(
        agent,
        store,
        concurrency=args.concurrency,
        worker_id=args.worker_id,
        lease_s=args.lease,
        isolation=args.isolation,
        default_timeout_s=args.default_timeout,
        worker_memory_mb=args.worker_memory_mb,
    )
    try:
        runner.prestart()
    except BoltrlError as e:
        print(f"boltrl runner: {e}")
        store.close()
        return 2
    freeze_long_lived()  # the agent and its SDKs are loaded: keep collections short
    print(f"boltrl runner {runner.worker_id}: {args.concurrency} slot(s) on {args.store}")
    try:
        stats = runner.run(max_rollouts=args.max_rollouts, exit_when_idle=args.exit_when_idle)
    finally:
        store.close()
    print(
        f"boltrl runner: claimed {stats.claimed}, succeeded {stats.succeeded}, "
        f"failed {stats.failed} (timed out {stats.timed_out}), abandoned {stats.abandoned}"
    )
    return 0


def register(commands: Commands) -> None:
    commands.add("runner", "run an agent on the rollouts of a store", _add, _run)
