"""``boltrl train`` / ``boltrl eval`` configuration: one YAML file, validated in one place.

Every field is documented where it is declared; a bad value is rejected with an error
that names the field (``grpo.clip_low: must be > 0``) before anything starts.
Command-line overrides use dotted keys: ``--set steps=4 --set grpo.group_size=8``.

Relative paths follow one rule: **a path is relative to where it was written.** A
relative path written in the config file resolves against the config file's folder;
one given on the command line (``--set key=…``, ``--out``) or in an inline config
(``boltrl demo``) against the working directory, as any command-line path does; a
default the file leaves unset (``out_dir``) counts as written in the file. Path-like
fields are ``agent`` and ``tasks.*`` (when they name a ``.py`` / ``.jsonl`` / ``.json``
file rather than ``module:function``), ``out_dir``, ``store`` (a ``sqlite:///`` URL's
path), ``init_from``, ``model`` (when it names a folder that exists there: otherwise it
is a hub name or ``smollm2``), and ``warm_start.tasks`` / ``warm_start.teacher`` (a
``file.py:function`` or a ``{store: URL}``). So ``out_dir: ../../runs/calc`` beside
``examples/calc/train.yaml`` is ``runs/calc`` under the repository root, wherever
``boltrl train`` is started from; the default store follows ``out_dir``.

``load_config`` checks the schema; what only a backend knows (settings that would do
nothing under verl, a missing GPU stack) is its registry entry's ``check``
(``boltrl_trainer.backends.backend_for``), which the trainer and ``boltrl eval`` run
before anything starts. This module knows no backend, so they can import it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from boltrl.errors import InvalidInput
from boltrl_trainer.trackers import DEFAULT_REPORT_TO, ReportTo
from boltrl_trainer.verl.settings import VerlConfig
from boltrl_trainer.warm_start_config import TeacherStoreConfig, WarmStartConfig


class _Cfg(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TasksConfig(_Cfg):
    """Where tasks come from. Each source is a JSONL/JSON file of task inputs (objects),
    or ``module:function`` / ``file.py:function`` returning a list of them."""

    train: str | None = None
    """Training tasks (required for ``boltrl train``)."""
    val: str | None = None
    """Held-out tasks evaluated every ``val_every`` steps at temperature 0."""
    test: str | None = None
    """Test tasks, only used by ``boltrl eval``."""
    limit_val: int | None = Field(default=None, ge=1)
    """Use only the first N validation tasks (keeps validation cheap on CPU)."""


class LoraConfig(_Cfg):
    """LoRA adapters (via peft) instead of a full fine-tune."""

    r: int = Field(default=16, ge=1)
    """Rank."""
    alpha: int = Field(default=32, ge=1)
    """Scaling numerator (scale = alpha / r)."""
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    target_modules: list[str] = Field(
        default_factory=lambda: [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ]
    )
    """Module names to adapt (attention and MLP projections by default)."""


class OptimConfig(_Cfg):
    """AdamW and the micro-batching of the update."""

    lr: float = Field(default=1e-4, gt=0)
    """Learning rate."""
    weight_decay: float = Field(default=0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = Field(default=1.0, gt=0)
    """Max global gradient norm."""
    token_budget: int = Field(default=4096, ge=64)
    """Max (padded) tokens per micro-batch; bounds memory, not results."""
    epochs: int = Field(default=1, ge=1)
    """Passes over each step's batch (>1 makes the PPO clip matter)."""


class DynamicSamplingConfig(_Cfg):
    """Dynamic sampling (``dynamic_sampling:`` in the config; DAPO's, verl's
    ``filter_groups``): more tasks in a step until enough groups have mixed rewards.

    A group whose rollouts all earn the same return has zero advantage under GRPO and
    RLOO and teaches nothing (``train/skipped_groups``). When a step's ``batch_tasks``
    tasks leave fewer than ``min_groups`` groups with differing returns, the step runs
    ``batch_tasks`` more tasks it has not used yet, up to ``max_rounds`` rounds in all.
    The update trains at most ``batch_tasks`` informative groups (the first ones, in
    sampling order; later ones are dropped and counted in ``train/trimmed_groups``), so
    it never costs more than a full batch would; the extra rounds cost generation time.
    Which tasks a round draws depends on the seed and step only (resumable)."""

    min_groups: int = Field(ge=1)
    """Stop sampling once this many groups of the step have differing returns (at most
    ``batch_tasks``)."""
    max_rounds: int = Field(default=3, ge=2)
    """Rounds of ``batch_tasks`` tasks a step may run, the first included: a bound on a
    step's generation time when few tasks are informative."""


class AsyncConfig(_Cfg):
    """Asynchronous training (``async:`` in the config): the rollouts of the next steps
    run while the update runs, on a separate copy of the trainable weights; generation
    pauses only while the new weights are copied in. Samples are then up to
    ``max_staleness`` policy versions old and are trained with decoupled PPO
    (``boltrl_trainer.offpolicy``). Torch backend only."""

    max_staleness: int = Field(ge=1)
    """How many policy versions old a trained sample may be; older ones are dropped and
    counted (``offpolicy/dropped``). Also how many steps' rollouts run ahead of the
    update: 1 overlaps the next step's rollouts with this step's update."""


class TrainConfig(_Cfg):
    """Everything ``boltrl train`` and ``boltrl eval`` need."""

    # ``async`` is a Python keyword: the field is ``async_``, written ``async`` in YAML,
    # ``--set async.max_staleness=1`` and dumps (checkpoints, trackers).
    model_config = ConfigDict(
        extra="forbid", validate_by_name=True, validate_by_alias=True, serialize_by_alias=True
    )

    agent: str
    """The agent: ``module:function`` or ``file.py:function`` (relative to the config file)."""
    tasks: TasksConfig = Field(default_factory=TasksConfig)
    model: str = "smollm2"
    """Model: ``smollm2`` (the default SmolLM2-135M-Instruct), a local path, or a hub name."""
    backend: Literal["torch", "verl"] = "torch"
    """Training backend: ``torch`` (one process, CPU or one GPU) or ``verl`` (multi-GPU)."""
    verl: VerlConfig | None = None
    """Settings of the verl backend (``boltrl_trainer.verl.settings``); only with
    ``backend: verl``."""
    device: str = "auto"
    """``auto`` (cuda if available, else cpu), ``cpu`` or ``cuda[:N]``."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    algorithm: Literal["grpo", "rloo", "reinforce"] = "grpo"
    algo: dict[str, Any] = Field(default_factory=dict)
    """Settings of the chosen algorithm (see ``boltrl_trainer.algorithms``)."""
    credit: dict[str, Any] = Field(default_factory=lambda: {"mode": "final"})
    """Credit assignment (``boltrl.credit.CreditConfig``): mode, gamma, agents, merge_prefix."""
    steps: int = Field(default=10, ge=0)
    """Training steps."""
    batch_tasks: int = Field(default=8, ge=1)
    """Distinct tasks per step."""
    group_size: int = Field(default=4, ge=1)
    """Rollouts per task per step (the GRPO group)."""
    concurrency: int = Field(default=8, ge=1)
    """Rollouts run at once by the in-process runners."""
    temperature: float = Field(default=1.0, ge=0)
    """Sampling temperature for training rollouts (validation uses 0)."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    max_tokens: int = Field(default=64, ge=1)
    """Max new tokens per model call."""
    rollout_timeout_s: float | None = Field(default=300.0, gt=0)
    """Wall-clock budget of one rollout; a hung agent is abandoned."""
    max_attempts: int = Field(default=2, ge=1)
    lora: LoraConfig | None = Field(default_factory=LoraConfig)
    """LoRA settings; null for a full fine-tune."""
    optim: OptimConfig = Field(default_factory=OptimConfig)
    val_every: int = Field(default=5, ge=0)
    """Validate every N steps (0: only before and after training)."""
    checkpoint_every: int = Field(default=0, ge=0)
    """Checkpoint every N steps (0: only at the end)."""
    out_dir: str = "runs/boltrl"
    """Where metrics, checkpoints, the plot and (by default) the store go (relative to
    the config file; see the module docstring)."""
    store: str | None = None
    """Store URL; default ``sqlite:///{out_dir}/store.db``. ``boltrl eval`` records into
    it too (its runs are named ``eval-…``)."""
    seed: int = 0
    progress: bool = True
    """Show a live progress bar."""
    report_to: ReportTo = Field(default_factory=lambda: list(DEFAULT_REPORT_TO))
    """Experiment trackers, as TRL and verl name them: any of ``jsonl``, ``tensorboard``,
    ``wandb``, ``mlflow`` (or ``none``); see ``boltrl_trainer.trackers``."""
    warm_start: WarmStartConfig | None = None
    """Supervised warm start from demonstrations, run before RL (and all that ``boltrl sft``
    runs); see ``boltrl_trainer.warm_start_config``. Torch backend only."""
    dynamic_sampling: DynamicSamplingConfig | None = None
    """Sample more tasks in a step while too few groups have mixed rewards
    (``DynamicSamplingConfig``); null: each step runs ``batch_tasks`` tasks."""
    async_: AsyncConfig | None = Field(default=None, alias="async")
    """Asynchronous training (``AsyncConfig``); null or absent: the synchronous loop
    (rollouts, then the update with generation paused, then the next rollouts)."""
    init_from: str | None = None
    """A checkpoint boltrl wrote (RL or warm start: its folder, or a run folder / its
    ``checkpoints`` folder, whose ``latest`` is taken) whose weights start the run
    (``boltrl train`` and ``boltrl sft``). Torch backend only."""

    _source: str = PrivateAttr(default="(inline)")
    _sections: dict[str, Any] = PrivateAttr(default_factory=dict)

    @property
    def store_url(self) -> str:
        return self.store or f"sqlite:///{Path(self.out_dir) / 'store.db'}"

    @property
    def source(self) -> str:
        """Where the config was read from (its file, else ``(inline)``), for errors."""
        return self._source

    @property
    def sections(self) -> dict[str, Any]:
        """Top-level sections another command owns (``load_config(sections=...)``), as
        written: e.g. ``boltrl serve``'s ``serve:``; validated by that command."""
        return dict(self._sections)


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    cur = data
    for p in parts[:-1]:
        nxt = cur.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise InvalidInput(f"--set {key}: {p!r} is not a section")
        cur = nxt
    cur[parts[-1]] = value


def _format_errors(e: ValidationError, source: str) -> str:
    lines = [f"invalid config {source}:"]
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling; see boltrl_trainer.config)"
        lines.append(f"  {loc}: {msg}")
    return "\n".join(lines)


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    *,
    data: dict[str, Any] | None = None,
    sections: tuple[str, ...] = (),
) -> TrainConfig:
    """Read a YAML config (or ``data``), apply ``key=value`` overrides (values parsed as
    YAML), resolve relative paths against the config file, and validate.

    Raises ``InvalidInput`` whose message lists every bad field by name. Backend checks
    are separate (see the module docstring). Top-level keys named in ``sections`` are
    taken out before validation and kept raw in ``TrainConfig.sections``.
    """
    raw: dict[str, Any] = dict(data or {})
    # keys not read from the file: their paths are the working directory's
    from_cli = set(raw) | {item.partition("=")[0].strip() for item in overrides or []}
    base = Path.cwd()
    source = "(inline)"
    if path is not None:
        p = Path(path)
        source = str(p)
        if not p.is_file():
            raise InvalidInput(f"config file {p} does not exist")
        try:
            loaded = yaml.safe_load(p.read_text())
        except yaml.YAMLError as e:
            raise InvalidInput(f"config file {p} is not valid YAML: {e}") from e
        if not isinstance(loaded, dict):
            raise InvalidInput(f"config file {p} must hold a mapping of settings")
        raw = {**loaded, **raw}
        base = p.resolve().parent
    for item in overrides or []:
        if "=" not in item:
            raise InvalidInput(f"override {item!r} must look like key=value")
        k, _, v = item.partition("=")
        _set_dotted(raw, k.strip(), yaml.safe_load(v))
    taken = {name: raw.pop(name) for name in sections if name in raw}
    try:
        cfg = TrainConfig.model_validate(raw)
    except ValidationError as e:
        raise InvalidInput(_format_errors(e, source)) from None

    def base_of(key: str) -> Path | None:
        cli = path is None or any(key == k or key.startswith(k + ".") for k in from_cli)
        return None if cli else base  # None: already relative to the working directory

    out = _resolve_paths(cfg, base_of)
    out._source = source
    out._sections = taken
    return out


def _resolve(value: str | None, base: Path | None) -> str | None:
    """``file.py:fn`` / ``x.jsonl`` / ``x.json`` against ``base``; ``module:fn`` as is."""
    if value is None or base is None:
        return value
    head = value.split(":", 1)[0]
    if head.endswith((".py", ".jsonl", ".json")) and not Path(head).is_absolute():
        return str(base / value)
    return value


def _resolve_dir(value: str | None, base: Path | None) -> str | None:
    if value is None or base is None or Path(value).expanduser().is_absolute():
        return value
    return str(base / value)


def _resolve_store(url: str | None, base: Path | None) -> str | None:
    """A relative ``sqlite:///path`` against ``base``; other URLs as they are."""
    if url is None or base is None or not url.startswith("sqlite:///"):
        return url
    if url.startswith("sqlite:////"):
        return url
    return "sqlite:///" + str(base / url.removeprefix("sqlite:///"))


def _resolve_model(value: str, base: Path | None) -> str:
    p = Path(value).expanduser()
    if base is None or p.is_absolute() or not (base / p).is_dir():
        return value  # a hub name, an alias (smollm2) or an absolute path
    return str(base / p)


def _resolve_paths(cfg: TrainConfig, base_of: Callable[[str], Path | None]) -> TrainConfig:
    """``cfg`` with every path-like field resolved by the module docstring's rule;
    ``base_of(dotted_key)`` is the folder a field's value is relative to (None: the
    working directory, so it stays as written)."""
    tasks = cfg.tasks.model_copy(
        update={
            k: _resolve(getattr(cfg.tasks, k), base_of(f"tasks.{k}"))
            for k in ("train", "val", "test")
        }
    )
    out_dir = _resolve_dir(cfg.out_dir, base_of("out_dir"))
    update: dict[str, Any] = {
        "agent": _resolve(cfg.agent, base_of("agent")),
        "tasks": tasks,
        "out_dir": out_dir,
        "store": _resolve_store(cfg.store, base_of("store")),
        "init_from": _resolve_dir(cfg.init_from, base_of("init_from")),
        "model": _resolve_model(cfg.model, base_of("model")),
    }
    if cfg.warm_start is not None:
        ws = cfg.warm_start.resolved(lambda v: _resolve(v, base_of("warm_start.tasks")))
        if isinstance(cfg.warm_start.teacher, str):
            teacher_base = base_of("warm_start.teacher")
            ws = ws.model_copy(update={"teacher": _resolve(cfg.warm_start.teacher, teacher_base)})
        elif isinstance(ws.teacher, TeacherStoreConfig):
            url = _resolve_store(ws.teacher.store, base_of("warm_start.teacher.store"))
            ws = ws.model_copy(update={"teacher": ws.teacher.model_copy(update={"store": url})})
        update["warm_start"] = ws
    return cfg.model_copy(update=update)
