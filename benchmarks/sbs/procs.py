"""Processes of the side-by-side run: the peer's virtual environment, and child processes
spoken to over the line protocol of ``wire.py``."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from wire import JSON

SBS = Path(__file__).resolve().parent
BENCHMARKS = SBS.parent
ROOT = BENCHMARKS.parent

PEER_VERSION = "0.3.0"
PEER_PINS = [
    f"agentlightning=={PEER_VERSION}",
    # The newest LiteLLM whose `proxy` extra resolves from PyPI (later ones need
    # litellm-proxy / litellm-proxy-extras releases that are not published).
    "litellm[proxy]==1.108.7",
    # OpenTelemetry as of agentlightning 0.3.0's release: from 1.40 the SDK keeps
    # None-valued attributes (AgentOps records an assistant tool-call turn's content as
    # None), which agentlightning's Span model rejects, failing the agent's second call.
    "opentelemetry-api==1.39.1",
    "opentelemetry-sdk==1.39.1",
    "opentelemetry-exporter-otlp==1.39.1",
    "opentelemetry-instrumentation==0.60b1",
    "fastapi==0.141.1",  # the newest that accepts opentelemetry-api 1.39
]
SAME_AS_PROJECT = ["langchain-core", "langchain-openai", "langgraph", "openai", "httpx"]
"""Installed in the peer's environment at the project's versions: both sides run the
same agent code on the same libraries."""

PEER_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # else LiteLLM fetches its cost map at start
    # agentlightning 0.3.0 starts LiteLLM's proxy without a master key, which LiteLLM
    # releases after it refuse unless told this (the proxy then serves without auth, as
    # agentlightning intends; boltrl's gateway on loopback does the same).
    "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "True",
    "AGENTOPS_API_KEY": "local",
}


def peer_requirements() -> list[str]:
    from importlib.metadata import version

    return [*PEER_PINS, *(f"{name}=={version(name)}" for name in SAME_AS_PROJECT)]


def peer_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def ensure_peer_venv(venv: Path, *, rebuild: bool = False) -> Path:
    """The peer's interpreter, creating the environment (``python3 -m venv`` + pip) when
    it is missing or was built for other requirements. Never touches the project's."""
    spec = "\n".join(peer_requirements()) + "\n"
    marker = venv / "boltrl-bench-requirements.txt"
    python = peer_python(venv)
    if not rebuild and python.exists() and marker.exists() and marker.read_text() == spec:
        return python
    print(f"building the peer's environment in {venv} (a few minutes) ...", flush=True)
    if venv.exists():
        subprocess.run([sys.executable, "-c", f"import shutil; shutil.rmtree({str(venv)!r})"])
    base = os.environ.get("BOLTRL_PEER_BASE_PYTHON", "python3")
    subprocess.run([base, "-m", "venv", str(venv)], check=True)
    env = {**os.environ, **PEER_ENV}
    env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # pip compiles the peer's bytecode once
    t0 = time.monotonic()
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            *spec.split(),
        ],
        check=True,
        env=env,
    )
    marker.write_text(spec)
    print(f"peer environment ready ({time.monotonic() - t0:.0f} s)", flush=True)
    return python


class ProcError(RuntimeError):
    pass


class Proc:
    """A child process in its own session, spoken to with JSON lines; its stderr goes to
    ``log``. ``close()`` ends its stdin, then signals its process group if it lingers."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        log: Path,
        env: dict[str, str] | None = None,
        *,
        stops_on_eof: bool = True,
    ) -> None:
        """``env`` is added to this process's environment. The child runs in the folder
        of its log (the peer's AgentOps writes an ``agentops.log`` where it runs).
        ``stops_on_eof``: whether closing its stdin ends it (else it is signalled)."""
        self.name = name
        self.stops_on_eof = stops_on_eof
        self.log = log
        self._err: IO[Any] = open(log, "w")
        self.p = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
            cwd=log.parent,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.p.pid

    def read(self, timeout_s: float) -> JSON:
        assert self.p.stdout is not None
        ready, _, _ = select.select([self.p.stdout], [], [], timeout_s)
        line = self.p.stdout.readline() if ready else ""
        if not line:
            state = "exited" if self.p.poll() is not None else f"silent for {timeout_s:.0f} s"
            raise ProcError(f"{self.name} {state}; its log ({self.log}) ends:\n{self.tail()}")
        reply: JSON = json.loads(line)
        if "error" in reply:
            raise ProcError(f"{self.name} failed:\n{reply['error']}")
        return reply

    def call(self, op: str, timeout_s: float = 600.0, **args: Any) -> JSON:
        assert self.p.stdin is not None
        self.p.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.p.stdin.flush()
        return self.read(timeout_s)

    def tail(self, lines: int = 30) -> str:
        self._err.flush()
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def close(self, timeout_s: float = 20.0) -> None:
        if self.p.poll() is None and self.stops_on_eof:
            try:
                assert self.p.stdin is not None
                self.p.stdin.close()
                self.p.wait(timeout_s)
            except (subprocess.TimeoutExpired, BrokenPipeError):
                pass
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:  # the group also holds what it spawned (the peer's proxy process)
                os.killpg(self.p.pid, sig)
            except ProcessLookupError:
                break
            time.sleep(0.5)
        self.p.wait()
        self._err.close()

    def __enter__(self) -> Proc:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def side_argv(python: Path | str, script: str, *args: str) -> list[str]:
    return [str(python), str(SBS / script), *args]
