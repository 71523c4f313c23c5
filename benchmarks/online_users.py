"""Online learning from simulated users: ``boltrl serve`` on the demo task.

A population of scripted users talks to a running ``boltrl serve`` (its gateway on
127.0.0.1, through the official OpenAI client, one session per question) about two-digit
additions (``boltrl_trainer.demo``), concurrently. Each user has a hidden preference and
rates each answer later (after a random delay, through ``boltrl.feedback.send_feedback``),
or never (the session expires and is not trained on):

- ``lenient`` (honest): the demo's scorer — 1 for a bare correct sum, 0.5 for a correct
  sum wrapped in words, 0 otherwise;
- ``strict`` (honest): 1 for a bare correct sum, else 0;
- ``inverted`` (adversarial): 1 - the lenient score;
- ``random`` (adversarial): 0, 0.5 or 1 at random.

Scenarios: ``honest`` (half lenient, half strict) and ``adversarial`` (a quarter honest,
half inverted, a quarter random: the feedback's net signal points the wrong way). The
gate (32 held-out problems, greedy, tolerance 0) decides every promotion; the
served policy's gate score over wall time is the curve. The final served policy is also
scored on 32 *other* held-out problems, before the users start and after they stop
(the gate set is used for selection, so its own score is biased upward).

    OMP_NUM_THREADS=1 uv run python benchmarks/online_users.py \
        --scenario honest --minutes 9 --out runs/online/honest
    ... --scenario adversarial --out runs/online/adversarial
    uv run python benchmarks/online_users.py --plot runs/online/honest runs/online/adversarial \
        --png benchmarks/online_users.png
    uv run python benchmarks/online_users.py --quick --out /tmp/q   # tiny model, ~30 s

Writes ``summary.json`` in the run folder (decisions with their wall time, sessions by
kind, the users' honest reward per minute, the held-out scores, load averages).
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import random
import shutil
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

KINDS = {
    "honest": ["lenient", "strict"],
    "adversarial": ["lenient", "inverted", "inverted", "random"],
}


def gate_tasks() -> list[Any]:
    from boltrl_trainer.demo import val_tasks

    return val_tasks()[:32]


def test_tasks() -> list[Any]:
    from boltrl_trainer.demo import val_tasks

    return val_tasks()[32:64]


def rating(kind: str, reply: str, answer: int, rng: random.Random) -> float:
    """What a user of ``kind`` reports for ``reply`` (module docstring)."""
    from boltrl_trainer.demo import score

    s = score(reply, answer)
    if kind == "lenient":
        return s
    if kind == "strict":
        return 1.0 if s == 1.0 else 0.0
    if kind == "inverted":
        return 1.0 - s
    return rng.choice([0.0, 0.5, 1.0])


class Mailbox:
    """Sends feedback when it is due, from one thread (users rate "later")."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._heap: list[tuple[float, str, float]] = []
        self._cv = threading.Condition()
        self._stop = False
        self.sent = 0
        self.refused: Counter[str] = Counter()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def post(self, at: float, session: str, reward: float) -> None:
        with self._cv:
            heapq.heappush(self._heap, (at, session, reward))
            self._cv.notify()

    def _run(self) -> None:
        from boltrl.errors import BoltrlError
        from boltrl.feedback import send_feedback

        while True:
            with self._cv:
                while not self._stop and (not self._heap or self._heap[0][0] > time.time()):
                    wait = self._heap[0][0] - time.time() if self._heap else None
                    self._cv.wait(wait)
                if self._stop:
                    return
                _, session, reward = heapq.heappop(self._heap)
            try:
                send_feedback(self.url, session, reward)
                self.sent += 1
            except BoltrlError as e:  # e.g. expired before the user got to it
                self.refused[type(e).__name__] += 1

    def stop(self) -> int:
        """Stop; returns how many ratings were still waiting to be sent."""
        with self._cv:
            self._stop = True
            self._cv.notify()
            left = len(self._heap)
        self._thread.join(10)
        return left


def user(
    uid: int,
    kind: str,
    srv: Any,
    mail: Mailbox,
    deadline: float,
    opts: dict[str, float],
    log: list[dict[str, Any]],
    lock: threading.Lock,
) -> None:
    from openai import OpenAI

    from boltrl_trainer.demo import PROMPT, train_tasks

    rng = random.Random(f"user-{uid}")
    tasks = train_tasks()
    n = 0
    while time.time() < deadline:
        t = rng.choice(tasks)
        a, b = t.input["a"], t.input["b"]
        session = f"u{uid}-{n}"
        n += 1
        client = OpenAI(base_url=srv.session_url(session), api_key="user", max_retries=0)
        started = time.time()
        try:
            reply = client.chat.completions.create(
                model="policy",
                messages=[{"role": "user", "content": PROMPT.format(a=a, b=b)}],
                temperature=0.2,  # the server forces its own: the update must know it
            )
            text = reply.choices[0].message.content or ""
        except Exception as e:  # a failed call is a lost user, counted
            with lock:
                log.append({"t": started, "kind": kind, "error": type(e).__name__})
            continue
        from boltrl_trainer.demo import score

        silent = rng.random() < opts["silent"]
        if not silent:
            delay = rng.uniform(opts["delay_min"], opts["delay_max"])
            mail.post(time.time() + delay, session, rating(kind, text, a + b, rng))
        with lock:
            log.append(
                {
                    "t": started,
                    "kind": kind,
                    "session": session,
                    "honest": score(text, a + b),
                    "silent": silent,
                }
            )
        time.sleep(rng.uniform(0.0, opts["think_max"]))


def config(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    from boltrl_trainer.demo import DEMO_CONFIG
    from boltrl_trainer.models import tiny_model

    here = Path(__file__).resolve()
    quick = args.quick
    return {
        **DEMO_CONFIG,
        "algorithm": "reinforce",
        "model": str(tiny_model()) if quick else "smollm2",
        "concurrency": 8 if quick else 32,
        "max_tokens": 8 if quick else 16,
        "lora": {"r": 4, "alpha": 8} if quick else DEMO_CONFIG["lora"],
        # one optimizer step per round (the demo takes 12 of 64 samples): a little more
        # than the demo's 2e-4 so that nine minutes of traffic show the trend
        "optim": {**DEMO_CONFIG["optim"], "lr": 3e-4},
        "report_to": ["jsonl"],
        "out_dir": str(out),
        "progress": False,
        "serve": {
            "port": 0,
            # a session's deadline runs from its call's start: leave a starved CPU room
            "feedback_timeout_s": 8.0 if quick else 20.0,
            "learn": {
                "every_sessions": 4 if quick else 32,
                "every_minutes": 0.1 if quick else 1.0,
                "max_staleness": 1,
                "max_sessions": 16 if quick else 64,
                "poll_s": 0.2 if quick else 1.0,
            },
            "gate": {
                "tasks": f"{here}:gate_tasks",
                "limit": 4 if quick else 32,
                "tolerance": args.tolerance,
            },
        },
    }


class Lines:
    """The CLI reporter with wall-clock stamps."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0

    def line(self, text: str) -> None:
        print(f"[{time.time() - self.t0:6.1f}s] {text}", flush=True)

    def progress(self, label: str, total: int) -> Any:
        from boltrl_trainer.cli_report import ConsoleReporter

        return ConsoleReporter(progress=False).progress(label, total)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from boltrl.store import open_store
    from boltrl_trainer.gate import Gate, read_decisions
    from boltrl_trainer.serve import OnlineServer
    from boltrl_trainer.serve_config import load_serve_config

    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    load_before = os.getloadavg()
    t0 = time.time()
    cfg = load_serve_config(None, data=config(args, out))
    reporter = Lines(t0)
    srv = OnlineServer(cfg, reporter=reporter).start(learn=False)
    assert srv.policy is not None and srv.learner is not None
    held_out = Gate(cfg, store=open_store("memory://"))
    held_out.tasks = test_tasks()[: 4 if args.quick else 32]
    before = held_out.score(srv.policy.gate_server, version=0)
    reporter.line(f"held-out test before: {before.mean:.3f} over {before.tasks} tasks")
    srv.learner.start()
    kinds = KINDS[args.scenario]
    opts = {
        "silent": 0.3 if args.quick else 0.15,
        "delay_min": 0.1 if args.quick else 0.5,
        "delay_max": 0.5 if args.quick else 6.0,
        "think_max": 0.2 if args.quick else 1.0,
    }
    mail = Mailbox(srv.url)
    log: list[dict[str, Any]] = []
    lock = threading.Lock()
    start_users = time.time()
    deadline = start_users + args.minutes * 60
    users = [
        threading.Thread(
            target=user,
            args=(i, kinds[i % len(kinds)], srv, mail, deadline, opts, log, lock),
            daemon=True,
        )
        for i in range(args.users)
    ]
    for u in users:
        u.start()
    for u in users:
        u.join()
    unsent = mail.stop()
    reporter.line("users stopped; waiting for the learner's round in progress")
    srv.learner.stop()
    served = srv.policy.served_version
    after = held_out.score(srv.policy.gate_server, version=served)
    reporter.line(f"held-out test after (v{served}): {after.mean:.3f}")
    expired = srv.store.count(status="cancelled")
    counters = dict(srv.learner.state.counters)
    srv.stop()
    held_out.close()
    decisions = read_decisions(out / "promotions.jsonl")
    for d in decisions:
        d["t_s"] = d["time"] - start_users
    ok = [x for x in log if "honest" in x]
    minutes: dict[int, list[float]] = {}
    for x in ok:
        minutes.setdefault(int((x["t"] - start_users) // 60), []).append(x["honest"])
    summary = {
        "scenario": args.scenario,
        "quick": args.quick,
        "model": cfg.train.model,
        "users": args.users,
        "minutes": args.minutes,
        "tolerance": args.tolerance,
        "sessions": len(ok),
        "failed_calls": len(log) - len(ok),
        "call_errors": dict(Counter(x["error"] for x in log if "error" in x)),
        "by_kind": dict(Counter(x["kind"] for x in ok)),
        "silent": sum(1 for x in ok if x["silent"]),
        "ratings_sent": mail.sent,
        "ratings_refused": dict(mail.refused),
        "ratings_unsent_at_stop": unsent,
        "expired": expired,
        "learner": counters,
        "decisions": decisions,
        "honest_reward_by_minute": {str(m): sum(v) / len(v) for m, v in sorted(minutes.items())},
        "held_out_before": before.mean,
        "held_out_after": after.mean,
        "held_out_tasks": after.tasks,
        "served_version": served,
        "wall_s": time.time() - t0,
        "load_before": load_before,
        "load_after": os.getloadavg(),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def plot(dirs: list[str], png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5), dpi=110, sharex=True)
    colors = ["tab:blue", "tab:red", "tab:cyan", "tab:orange", "tab:gray"]
    for i, d in enumerate(dirs):
        s = json.loads((Path(d) / "summary.json").read_text())
        c = colors[i % len(colors)]
        name = f"{Path(d).name} (load {s['load_before'][0]:.1f})"
        xs, ys = [], []
        for x in s["decisions"]:
            score = x["candidate_score"] if x["decision"] == "promote" else x["served_score"]
            xs.append(max(x["t_s"], 0.0) / 60)
            ys.append(score)
        xs.append(max(s["minutes"], xs[-1]))  # the last round may end after the users
        ys.append(ys[-1])
        n_prom = sum(1 for x in s["decisions"] if x["decision"] == "promote")
        n_roll = sum(1 for x in s["decisions"] if x["decision"] == "rollback")
        top.step(
            xs,
            ys,
            where="post",
            color=c,
            label=f"{name}: served policy ({n_prom} promoted, {n_roll} rolled back)",
        )
        rx = [max(x["t_s"], 0) / 60 for x in s["decisions"] if x["decision"] == "rollback"]
        ry = [x["candidate_score"] for x in s["decisions"] if x["decision"] == "rollback"]
        top.scatter(rx, ry, marker="x", color=c, alpha=0.6, s=22)
        m = s["honest_reward_by_minute"]
        bottom.plot(
            [int(k) + 0.5 for k in m],
            list(m.values()),
            marker="o",
            color=c,
            label=f"{name}: what users got (honest score)",
        )
    top.set_ylabel("gate reward (32 held-out, greedy)")
    top.set_title("boltrl serve: served policy over wall time (x: rejected candidates)")
    top.grid(alpha=0.3)
    top.legend(loc="best", fontsize=8)
    bottom.set_xlabel("wall time (minutes)")
    bottom.set_ylabel("live reward per minute")
    bottom.grid(alpha=0.3)
    bottom.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--scenario", choices=sorted(KINDS), default="honest")
    ap.add_argument("--minutes", type=float, default=9.0, help="how long users talk")
    ap.add_argument("--users", type=int, default=12, help="concurrent users")
    ap.add_argument("--tolerance", type=float, default=0.0, help="the gate's tolerance")
    ap.add_argument("--quick", action="store_true", help="tiny model, seconds (tests)")
    ap.add_argument("--out", default="runs/online", help="run folder (replaced)")
    ap.add_argument("--plot", nargs="+", default=None, metavar="RUN_DIR")
    ap.add_argument("--png", default="benchmarks/online_users.png")
    args = ap.parse_args()
    if args.plot:
        plot(args.plot, args.png)
        print(f"plot: {args.png}")
        return
    if args.quick:
        args.minutes = min(args.minutes, 0.3)
        args.users = min(args.users, 4)
    s = run(args)
    promoted = sum(1 for d in s["decisions"] if d["decision"] == "promote")
    rolled = sum(1 for d in s["decisions"] if d["decision"] == "rollback")
    print(
        f"{s['scenario']}: {s['sessions']} sessions ({s['silent']} never rated, "
        f"{s['expired']} expired), {promoted} promotions, {rolled} rollbacks, served "
        f"v{s['served_version']}; held-out {s['held_out_before']:.3f} -> "
        f"{s['held_out_after']:.3f}; {s['wall_s']:.0f} s; load {s['load_before'][0]:.1f} -> "
        f"{s['load_after'][0]:.1f}"
    )
    print(f"summary: {Path(args.out) / 'summary.json'}")


if __name__ == "__main__":
    main()
