"""``report_to``: a real 1-step ``boltrl train`` on the tiny model reporting to JSONL,
TensorBoard, W&B (offline mode) and MLflow (a ``file:`` store), each read back with its own
reader: the metrics per step, the run's config and its lineage (model, policy version,
boltrl version)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from trainer_harness import VOWEL_AGENT, read_jsonl, run_cli_ok, write_project

from boltrl.errors import InvalidInput
from boltrl_trainer.config import load_config


def wandb_records(path: Path) -> list[Any]:
    """The records of an offline W&B run file (``run-ID.wandb``): W&B's LevelDB-style log
    (7-byte file header; 32 KiB blocks of chunks with a 7-byte header: CRC, length, type)
    of ``wandb_internal_pb2.Record`` messages. wandb ships no reader for it any more."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B", "not a W&B run file"
    pos, parts, records = 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        parts += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = pb.Record()
            record.ParseFromString(parts)
            records.append(record)
            parts = b""
    return records


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, tiny_model_path: Path) -> Path:
    d = tmp_path_factory.mktemp("trackers")
    cfg = {
        "agent": "agent.py:agent",
        "model": str(tiny_model_path),
        "steps": 1,
        "batch_tasks": 2,
        "group_size": 2,
        "max_tokens": 6,
        "lora": {"r": 2, "alpha": 4},
        "report_to": ["jsonl", "tensorboard", "wandb", "mlflow"],
        "out_dir": str(d / "out"),
        "progress": False,
    }
    tasks = {
        "train": [{"id": f"t{i}", "prompt": f"Say {i}."} for i in range(2)],
        "val": [{"id": "v0", "prompt": "Describe 0."}],
    }
    write_project(d, cfg, files={"agent.py": VOWEL_AGENT}, tasks=tasks)
    env = {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_PROJECT": "boltrl-test",
        "MLFLOW_TRACKING_URI": f"file:{d / 'mlruns'}",
        "MLFLOW_ALLOW_FILE_STORE": "true",  # MLflow 3 keeps the file store behind this flag
        "MLFLOW_EXPERIMENT_NAME": "boltrl-test",
    }
    run_cli_ok("train", "train.yaml", cwd=d, threads=2, env=env)
    return d


def test_jsonl_and_tensorboard(run: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rows = read_jsonl(run / "out" / "metrics.jsonl")
    assert [r["step"] for r in rows if "update/loss" in r] == [1]
    assert [r["step"] for r in rows if "val/reward_mean" in r] == [0, 1]
    events = EventAccumulator(str(run / "out" / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("policy_version")] == [1]
    assert [e.step for e in events.Scalars("val/reward_mean")] == [0, 1]
    text = events.Tensors("run/text_summary")[0].tensor_proto.string_val[0].decode()
    assert '"lineage"' in text and '"boltrl_version"' in text


def test_wandb_offline_run_has_config_lineage_and_metrics(run: Path) -> None:
    files = list((run / "out" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1, files
    records = wandb_records(files[0])
    kinds = [r.WhichOneof("record_type") for r in records]
    start = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert (start.project, start.display_name) == ("boltrl-test", "out")
    config = {u.key: json.loads(u.value_json) for u in start.config.update}
    config.update(
        {
            u.key: json.loads(u.value_json)
            for r in records
            if r.WhichOneof("record_type") == "config"
            for u in r.config.update
        }
    )
    assert config["steps"] == 1 and config["report_to"] == [
        "jsonl",
        "tensorboard",
        "wandb",
        "mlflow",
    ]
    lineage = config["lineage"]
    assert lineage["model"] == str(Path(config["model"]))
    assert lineage["policy_version"] == 0 and lineage["resumed"] is False
    assert lineage["boltrl_version"] == lineage["boltrl_versions"]["boltrl"]
    assert "boltrl-trainer" in lineage["boltrl_versions"]

    by_step: dict[int, dict[str, Any]] = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            items = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item
            }
            by_step.setdefault(r.history.step.num, {}).update(items)
    assert sorted(by_step) == [0, 1]
    assert by_step[1]["policy_version"] == 1 and "update/loss" in by_step[1]
    assert "val/reward_mean" in by_step[0] and "val/reward_mean" in by_step[1]
    assert "exit" in kinds  # finished, not left running


def test_mlflow_file_store_run_has_params_tags_and_metrics(
    run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(f"file:{run / 'mlruns'}")
    exp = client.get_experiment_by_name("boltrl-test")
    assert exp is not None
    (found,) = client.search_runs([exp.experiment_id])
    assert found.info.run_name == "out" and found.info.status == "FINISHED"
    params, tags = found.data.params, found.data.tags
    assert params["steps"] == "1" and params["lora.r"] == "2" and params["algorithm"] == "grpo"
    assert tags["boltrl.model"] == params["model"] and tags["boltrl.policy_version"] == "0"
    assert tags["boltrl.boltrl_version"] == json.loads(tags["boltrl.boltrl_versions"])["boltrl"]
    assert [
        (m.step, m.value) for m in client.get_metric_history(found.info.run_id, "policy_version")
    ] == [(1, 1.0)]
    assert [m.step for m in client.get_metric_history(found.info.run_id, "val/reward_mean")] == [
        0,
        1,
    ]
    art = client.download_artifacts(found.info.run_id, "config.json", str(run / "dl"))
    saved = json.loads(Path(art).read_text())
    assert saved["config"]["steps"] == 1 and saved["lineage"]["policy_version"] == 0


def test_report_to_spellings_and_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = {"agent": "a.py:agent"}
    assert load_config(data=base).report_to == ["jsonl", "tensorboard"]
    assert load_config(data={**base, "report_to": "wandb"}).report_to == ["wandb"]
    assert load_config(data={**base, "report_to": "none"}).report_to == []
    assert load_config(None, ["report_to=[mlflow, jsonl]"], data=base).report_to == [
        "mlflow",
        "jsonl",
    ]
    with pytest.raises(InvalidInput, match=r"report_to\.0: Input should be 'jsonl', 'tensorb"):
        load_config(data={**base, "report_to": ["comet"]})
    # a tracker whose package cannot be imported: named with its install command
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(
        InvalidInput, match=r"report_to: .*wandb is not installed: pip install wandb"
    ):
        load_config(data={**base, "report_to": ["jsonl", "wandb"]})


def test_a_tracker_that_cannot_start_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from boltrl_trainer.metrics import MetricsWriter

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nosuchscheme://somewhere")
    with pytest.raises(InvalidInput, match=r"report_to: mlflow could not open .*nosuchscheme"):
        MetricsWriter(tmp_path / "out", report_to=["jsonl", "mlflow"])
    assert (tmp_path / "out" / "metrics.jsonl").read_text() == ""
