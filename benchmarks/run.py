"""Side-by-side benchmarks against Agent Lightning (``agentlightning`` 0.3.0).

    uv run python benchmarks/run.py --peer [--quick] [--workloads capture,proxy,store,convert]
    uv run python benchmarks/run.py --peer --workloads trl    # beside TRL's GRPOTrainer

With ``--peer`` it builds the peer's own virtual environment (``benchmarks/.peer-venv``,
``python3 -m venv`` + pip; never the project's) on first use, then runs every workload
against both sides in this one invocation, alternating them round by round, and prints
a table: each side's median, p99 where it applies, and the median of the per-round
ratios boltrl / Agent Lightning. Each side runs in its own processes (the peer's with
its own interpreter); they meet only over HTTP and stdin/stdout JSON lines
(``benchmarks/sbs/``). Without ``--peer`` only boltrl's column is measured.

A full ``--peer`` run rewrites the section between ``<!-- peer:begin -->`` and
``<!-- peer:end -->`` in benchmarks/README.md (``--no-readme`` to skip; ``--readme`` to
force it for other runs). ``--quick`` uses small sizes (for the test).

The ``trl`` workload (not in the default set: a full run takes most of an hour) trains
``boltrl demo`` beside TRL's GRPOTrainer, pinned in its own venv (``benchmarks/.trl-venv``,
``sbs/trl_workload.py``), and writes its own section, between ``<!-- trl:begin -->`` and
``<!-- trl:end -->``. ``--quick`` runs it on the tiny random model for one step.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from importlib.metadata import version
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent / "sbs"))

import procs
import trl_workload
import workloads
from workloads import FULL, QUICK, Report, Row

README = procs.BENCHMARKS / "README.md"
BEGIN, END = "<!-- peer:begin -->", "<!-- peer:end -->"
HEADING = "## Side by side with Agent Lightning"
ORDER = ["capture", "proxy", "store", "convert"]
"""How the table lists the workloads (they run capture, convert, proxy, store)."""
OPTIONAL = ["trl"]
"""Workloads run only when named in ``--workloads``."""
TRL_MARKERS = ("<!-- trl:begin -->", "<!-- trl:end -->", "### Side by side with TRL")
PEER_VERSIONS = [
    "agentlightning",
    "litellm",
    "agentops",
    "opentelemetry-sdk",
    "langchain-core",
    "langchain-openai",
    "langgraph",
    "openai",
]


# --------------------------------------------------------------------------- formatting


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    if unit == "/s":
        return f"{value:,.0f}"
    digits = 0 if abs(value) >= 100 else 1 if abs(value) >= 10 else 2
    return f"{value:,.{digits}f} {unit}"


def table(rows: list[Row]) -> str:
    lines = [
        "| workload | measure | boltrl | Agent Lightning | boltrl / AL | boltrl ahead |",
        "|---|---|---:|---:|---:|:---:|",
    ]
    for r in rows:
        ratio = "—" if r.ratio is None else f"{r.ratio:.2f}"
        ahead = {None: "—", True: "yes", False: "**no**"}[r.ahead]
        lines.append(
            f"| {r.workload} | {r.measure} | {fmt(r.boltrl, r.unit)} | "
            f"{fmt(r.peer, r.unit)} | {ratio} | {ahead} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- context


def machine() -> str:
    cpu = "unknown CPU"
    mem = 0.0
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) / 2**20
    except OSError:
        pass
    return (
        f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GiB RAM, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}"
    )


def peer_versions(peer_py: Path) -> dict[str, str]:
    code = (
        "import json, importlib.metadata as m; "
        f"print(json.dumps({{n: m.version(n) for n in {PEER_VERSIONS!r}}}))"
    )
    out = subprocess.run([str(peer_py), "-c", code], capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout))


def notes(reports: dict[str, Report]) -> list[str]:
    out = []
    for name in ORDER:
        for key, value in reports[name].notes.items() if name in reports else ():
            text = value if isinstance(value, str) else json.dumps(value)
            out.append(f"- {name}, {key}: {text}")
    return out


def section(rows: list[Row], reports: dict[str, Report], meta: dict[str, Any], cmd: str) -> str:
    pv = meta.get("peer_versions") or {}
    peer = (
        f"agentlightning {pv['agentlightning']} (litellm {pv['litellm']}, agentops "
        f"{pv['agentops']}, opentelemetry-sdk {pv['opentelemetry-sdk']}); both sides: "
        f"langchain-core {pv['langchain-core']}, langchain-openai {pv['langchain-openai']}, "
        f"langgraph {pv['langgraph']}, openai {pv['openai']}"
        if pv
        else "peer not measured"
    )
    return "\n".join(
        [
            f"_Generated by `{cmd}` on {meta['date']} in {meta['minutes']:.0f} min; "
            "rerun it rather than editing these lines._",
            "",
            f"- Machine: {meta['machine']}; load average {meta['load'][0]:.1f} at the start "
            f"and {meta['load'][1]:.1f} at the end (shared with other work: compare the "
            "two columns of one run, not runs with each other).",
            f"- Versions: boltrl {meta['boltrl']}; {peer}.",
            f"- Sizes: {meta['sizes']}.",
            "",
            "```",
            cmd,
            "```",
            "",
            table(rows),
            "",
            *notes(reports),
        ]
    )


def write_readme(text: str, begin: str = BEGIN, end: str = END, heading: str = HEADING) -> None:
    doc = README.read_text()
    block = f"{begin}\n{text}\n{end}"
    if begin in doc and end in doc:
        head, rest = doc.split(begin, 1)
        doc = head + block + rest.split(end, 1)[1]
    else:
        doc = doc.rstrip("\n") + f"\n\n{heading}\n\n{block}\n"
    README.write_text(doc)


def trl_table(rows: list[Row]) -> str:
    lines = [
        "| measure | boltrl | TRL | boltrl / TRL | boltrl ahead |",
        "|---|---:|---:|---:|:---:|",
    ]
    for r in rows:
        ratio = "—" if r.ratio is None else f"{r.ratio:.2f}"
        ahead: bool | None = None
        if r.peer is not None:
            ahead = r.boltrl < r.peer if r.better == "lower" else r.boltrl > r.peer
        mark = {None: "—", True: "yes", False: "**no**"}[ahead]
        if r.unit == "":
            b, p = f"{r.boltrl:+.3f}" if "gain" in r.measure else f"{r.boltrl:.3f}", "—"
            if r.peer is not None:
                p = f"{r.peer:+.3f}" if "gain" in r.measure else f"{r.peer:.3f}"
        else:
            b, p = fmt(r.boltrl, r.unit), fmt(r.peer, r.unit)
        lines.append(f"| {r.measure} | {b} | {p} | {ratio} | {mark} |")
    return "\n".join(lines)


def trl_section(report: Report, meta: dict[str, Any], cmd: str) -> str:
    tv = meta.get("trl_versions") or {}
    peer = (
        ", ".join(f"{k} {v}" for k, v in tv.items()) + " (TRL's venv)" if tv else "TRL not measured"
    )
    runs = report.notes.get("runs", {})
    lines = [
        f"_Generated by `{cmd}` on {meta['date']} in {meta['minutes']:.0f} min; "
        "rerun it rather than editing these lines._",
        "",
        f"- Machine: {meta['machine']}; load average {meta['load'][0]:.1f} at the start "
        f"and {meta['load'][1]:.1f} at the end (shared with other work).",
        f"- Versions: boltrl {meta['boltrl']}; {peer}.",
        f"- Sizes: {meta['trl_sizes']}; both sides: LoRA r16 alpha 32 on attention + MLP, lr, "
        "temperature and held-out problems of `boltrl demo`, fp32, no KL.",
        "",
        "```",
        cmd,
        "```",
        "",
        trl_table(report.rows),
        "",
        "Per run (seed = round; load average at its start and end):",
        "",
    ]
    for side, rs in runs.items():
        for r in rs:
            lines.append(
                f"- {side}: held-out {r['val_before']:.3f} → {r['val_after']:.3f}, training "
                f"{r['train_s']:.0f} s, whole run {r['wall_s']:.0f} s, "
                f"peak {r['peak_mb']:,.0f} MB, load {r['load'][0]:.1f} to {r['load'][1]:.1f}"
            )
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def _timed(name: str, fn: Any, *args: Any) -> Report:
    t0 = time.monotonic()
    print(f"{name} ...", end=" ", flush=True)
    report: Report = fn(*args)
    print(f"{time.monotonic() - t0:.0f} s", flush=True)
    return report


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--peer", action="store_true", help="also measure Agent Lightning")
    p.add_argument("--quick", action="store_true", help="small sizes (seconds, not minutes)")
    p.add_argument("--workloads", default=",".join(ORDER), help="comma-separated subset")
    p.add_argument("--rounds", type=int, help="paired rounds (default: 5, --quick 1)")
    p.add_argument(
        "--readme",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="rewrite the README section (default: for full --peer runs)",
    )
    p.add_argument(
        "--trl-steps", type=int, help="training steps of each trl run (default: 12, --quick 1)"
    )
    p.add_argument("--json", type=Path, help="also write rows and notes to this file")
    p.add_argument("--peer-venv", type=Path, default=procs.BENCHMARKS / ".peer-venv")
    p.add_argument("--trl-venv", type=Path, default=trl_workload.TRL_VENV)
    p.add_argument("--rebuild-peer", action="store_true", help="recreate the peers' venvs")
    args = p.parse_args()
    chosen = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = set(chosen) - set(ORDER) - set(OPTIONAL)
    if unknown:
        p.error(
            f"--workloads: unknown {', '.join(sorted(unknown))}; choose from {ORDER + OPTIONAL}"
        )
    sizes = QUICK if args.quick else FULL
    if args.rounds:
        sizes = workloads.Sizes(**{**vars(sizes), "rounds": args.rounds})
    want_al = bool(set(chosen) & set(ORDER))
    peer_py = (
        procs.ensure_peer_venv(args.peer_venv, rebuild=args.rebuild_peer)
        if args.peer and want_al
        else None
    )
    trl_py = (
        trl_workload.ensure_trl_venv(args.trl_venv, rebuild=args.rebuild_peer)
        if args.peer and "trl" in chosen
        else None
    )
    trl_sizes = trl_workload.TRL_QUICK if args.quick else trl_workload.TRL_FULL
    if args.rounds:
        trl_sizes = trl_workload.TrlSizes(**{**vars(trl_sizes), "rounds": args.rounds})
    if args.trl_steps:
        trl_sizes = trl_workload.TrlSizes(**{**vars(trl_sizes), "steps": args.trl_steps})

    t0, load0 = time.monotonic(), os.getloadavg()[0]
    logs = Path(tempfile.mkdtemp(prefix="boltrl-side-by-side-"))
    print(f"logs of every process: {logs}", flush=True)
    reports: dict[str, Report] = {}
    with ExitStack() as stack:
        if {"capture", "proxy", "convert"} & set(chosen):
            sides = workloads.start_sides(stack, logs, sys.executable, peer_py)
            for name in ("capture", "convert", "proxy"):
                if name in chosen:
                    reports[name] = _timed(name, workloads.WORKLOADS[name], sides, sizes)
    if "store" in chosen:
        reports["store"] = _timed("store", workloads.store, sys.executable, peer_py, logs, sizes)
    trl_report = (
        _timed("trl", trl_workload.trl, trl_py, logs, trl_sizes) if "trl" in chosen else None
    )
    rows = [r for name in ORDER if name in reports for r in reports[name].rows]

    meta: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "minutes": (time.monotonic() - t0) / 60,
        "machine": machine(),
        "load": (load0, os.getloadavg()[0]),
        "boltrl": version("boltrl"),
        "peer_versions": peer_versions(peer_py) if peer_py else None,
        "trl_versions": trl_workload.trl_versions(trl_py) if trl_py else None,
        "sizes": sizes.describe(),
        "trl_sizes": trl_sizes.describe(),
    }
    cmd = (
        "benchmarks/run.py"
        + (" --peer" if args.peer else "")
        + (" --quick" if args.quick else "")
        + (f" --rounds {args.rounds}" if args.rounds else "")
    )
    trl_cmd = cmd + (f" --trl-steps {args.trl_steps}" if args.trl_steps else "")
    write = args.readme or (args.readme is None and args.peer and not args.quick)
    if rows:
        text = section(rows, reports, meta, "uv run python " + cmd)
        print()
        print(text)
        if write:
            write_readme(text)
            print(f"\nwrote the section of {README}")
    if trl_report is not None:
        trl_cmd = "uv run python " + trl_cmd + " --workloads trl"
        text = trl_section(trl_report, meta, trl_cmd)
        print()
        print(text)
        if write:
            write_readme(text, *TRL_MARKERS)
            print(f"\nwrote the TRL section of {README}")
        rows = rows + trl_report.rows
    if args.json:
        data = {"rows": [vars(r) for r in rows], "notes": notes(reports), "meta": meta}
        if trl_report is not None:
            data["trl_runs"] = trl_report.notes.get("runs", {})
        args.json.write_text(json.dumps(data, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
