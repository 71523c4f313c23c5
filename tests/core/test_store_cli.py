"""``boltrl store serve``: loopback by default, a token required anywhere else, and a
served store that an ``open_store("http://…", token=…)`` client drives end to end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from boltrl.cli import main
from boltrl.errors import InvalidInput, Unauthorized
from boltrl.records import RolloutStatus, Task
from boltrl.store import MemoryStore, open_store
from boltrl.store.server import check_exposure, serve_in_thread

pytestmark = pytest.mark.timeout(60)


def test_serving_beyond_loopback_requires_a_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BOLTRL_TOKEN", raising=False)
    for host in ("127.0.0.1", "127.0.0.5", "::1", "localhost"):
        check_exposure(host, None)
    check_exposure("0.0.0.0", "t")
    for host in ("0.0.0.0", "10.1.2.3", "::", "example.org"):
        with pytest.raises(InvalidInput, match="without a token"):
            check_exposure(host, None)
    with MemoryStore() as store, pytest.raises(InvalidInput, match="without a token"):
        serve_in_thread(store, host="0.0.0.0")
    db = tmp_path / "x.db"
    assert main(["store", "serve", "--db", str(db), "--host", "0.0.0.0"]) == 2
    assert "refusing to serve on '0.0.0.0' without a token" in capsys.readouterr().err
    assert not db.exists()  # refused before touching anything


def test_cli_serves_a_sqlite_store_with_a_token(tmp_path: Path) -> None:
    db = tmp_path / "served.db"
    cli = "import sys; from boltrl.cli import main; sys.exit(main())"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            cli,
            "store",
            "serve",
            "--db",
            str(db),
            "--port",
            "0",
            "--token",
            "tok",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "(token required)" in line, line
        url = line.split(" on ")[1].split()[0]
        with open_store(url, token="tok") as store:
            [rid] = store.enqueue([Task(input={"q": 1})])
            att = store.claim("w", lease_s=5.0, wait_s=5.0)
            assert att is not None and att.rollout_id == rid
            store.finish(att, "succeeded", reward=1.0)
        with open_store(url) as anonymous, pytest.raises(Unauthorized):
            anonymous.count()
    finally:
        proc.terminate()
        proc.wait(10)
    with open_store(f"sqlite:///{db}") as reopened:  # the served file is a normal store
        assert reopened.get(rid).status is RolloutStatus.SUCCEEDED
