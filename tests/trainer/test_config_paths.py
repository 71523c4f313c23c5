"""One rule for relative paths in a config: relative to where the path was written (the
config file's folder for the file's values and defaults; the working directory for
``--set`` / ``--out`` and inline configs)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from boltrl_trainer.config import load_config
from boltrl_trainer.warm_start_config import TeacherStoreConfig


def _write(d: Path, cfg: dict[str, object]) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "train.yaml").write_text(yaml.safe_dump(cfg))
    return d / "train.yaml"


def test_every_path_in_the_file_is_relative_to_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tmp_path / "project" / "conf"
    (conf / "weights").mkdir(parents=True)
    path = _write(
        conf,
        {
            "agent": "agent.py:run",
            "tasks": {"train": "data/train.jsonl", "val": "mypkg.tasks:val"},
            "model": "weights",
            "out_dir": "../runs/a",
            "store": "sqlite:///state/s.db",
            "init_from": "ckpt/step-000001",
            "warm_start": {"teacher": {"store": "sqlite:///old.db"}, "tasks": "demo.jsonl"},
        },
    )
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = load_config(path)
    assert cfg.agent == f"{conf}/agent.py:run"
    assert (cfg.tasks.train, cfg.tasks.val) == (f"{conf}/data/train.jsonl", "mypkg.tasks:val")
    assert cfg.model == f"{conf}/weights"
    assert cfg.out_dir == f"{conf}/../runs/a"
    assert cfg.store == f"sqlite:///{conf}/state/s.db"
    assert cfg.init_from == f"{conf}/ckpt/step-000001"
    assert cfg.warm_start is not None and cfg.warm_start.tasks == f"{conf}/demo.jsonl"
    assert cfg.warm_start.teacher == TeacherStoreConfig(store=f"sqlite:///{conf}/old.db")

    # a default counts as written in the file; hub names and absolute paths stay as they are
    cfg = load_config(_write(conf, {"agent": "m:f", "model": "org/model"}))
    assert cfg.out_dir == f"{conf}/runs/boltrl"
    assert cfg.store_url == f"sqlite:///{conf}/runs/boltrl/store.db"
    assert (cfg.agent, cfg.model) == ("m:f", "org/model")
    cfg = load_config(_write(conf, {"agent": "m:f", "store": "sqlite:////abs/s.db"}))
    assert cfg.store == "sqlite:////abs/s.db"


def test_command_line_paths_are_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tmp_path / "conf"
    path = _write(conf, {"agent": "agent.py:run", "out_dir": "runs/a", "tasks": {"val": "v.jsonl"}})
    monkeypatch.chdir(tmp_path)
    cfg = load_config(path, ["out_dir=runs/b", "tasks.train=t.jsonl", "store=sqlite:///x.db"])
    # left as written: they already are the working directory's
    assert (cfg.out_dir, cfg.tasks.train, cfg.store) == ("runs/b", "t.jsonl", "sqlite:///x.db")
    # what the command line left alone still follows the file
    assert (cfg.agent, cfg.tasks.val) == (f"{conf}/agent.py:run", f"{conf}/v.jsonl")
    # an overridden section: every path in it is the command line's
    cfg = load_config(path, ["tasks={train: t.jsonl}"])
    assert cfg.tasks.train == "t.jsonl"
    # inline configs (boltrl demo) have no file: the working directory
    cfg = load_config(data={"agent": "a.py:f", "out_dir": "runs/demo"})
    assert (cfg.agent, cfg.out_dir) == ("a.py:f", "runs/demo")
