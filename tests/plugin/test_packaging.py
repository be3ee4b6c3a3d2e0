"""Packaging of the shipped profiles: the wheel and the sdist carry ``gpu_profiles/``.

``SHIPPED_DIR`` is unit-tested on fake layouts (no build). The build tests run the
real ``pip wheel --no-deps --no-build-isolation`` offline, on a copy of the files a
build reads, so the checkout gets no ``build/`` or ``*.egg-info`` and parallel
workers share nothing.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import List, Optional

import pytest

from pytest_nsa.profiles import SHIPPED_DIR, Catalog, _shipped_dir

REPO = Path(__file__).resolve().parents[2]
CHECKOUT_PROFILES = REPO / "gpu_profiles"
#: Top-level files and folders the build reads (pyproject.toml names README.md as readme).
BUILD_INPUTS = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "src", "gpu_profiles")
#: Files checked by name as well, so that a copy pattern that matches nothing fails.
NAMED = ("base.yaml", "h100.yaml", "baselines/h100/benchmarks.json")


def fake_module(root: Path) -> Path:
    """``<root>/pytest_nsa/profiles.py``, the resolved path ``_shipped_dir`` is given."""
    module = root / "pytest_nsa" / "profiles.py"
    module.parent.mkdir(parents=True)
    module.touch()
    return module


def test_shipped_dir_prefers_the_checkout_folder(tmp_path):
    module = fake_module(tmp_path / "src")
    (tmp_path / "gpu_profiles").mkdir()
    # A stray package copy must not win over the checkout's, the one baselines are saved to.
    (module.parent / "gpu_profiles").mkdir()
    assert _shipped_dir(module) == tmp_path / "gpu_profiles"


def test_shipped_dir_falls_back_to_the_package_copy(tmp_path):
    module = fake_module(tmp_path / "lib" / "python3.11" / "site-packages")
    assert _shipped_dir(module) == module.parent / "gpu_profiles"


def test_shipped_dir_of_this_checkout_is_the_top_level_folder():
    assert SHIPPED_DIR == CHECKOUT_PROFILES


def source_profiles() -> List[str]:
    """The checkout's profile files, relative to ``gpu_profiles/``."""
    files = [*CHECKOUT_PROFILES.glob("*.yaml"), *CHECKOUT_PROFILES.glob("baselines/*/benchmarks.json")]
    return sorted(p.relative_to(CHECKOUT_PROFILES).as_posix() for p in files)


def missing_build_tools() -> Optional[str]:
    """Why the offline build cannot run here, or None."""
    if importlib.util.find_spec("pip") is None:
        return "pip is not installed"
    try:
        setuptools_version = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        return "setuptools is not installed (--no-build-isolation builds with the installed one)"
    if int(setuptools_version.split(".")[0]) < 64:
        return f"setuptools {setuptools_version} is older than pyproject.toml's setuptools>=64"
    # setuptools 70.1 took bdist_wheel over from the wheel package. Looked up by file:
    # importing setuptools here would clash with the distutils the session already imported.
    setuptools_dir = Path(importlib.util.find_spec("setuptools").origin).parent
    if not (setuptools_dir / "command" / "bdist_wheel.py").is_file() and importlib.util.find_spec("wheel") is None:
        return f"setuptools {setuptools_version} has no bdist_wheel and the wheel package is not installed"
    return None


needs_build_tools = pytest.mark.skipif(missing_build_tools() is not None, reason=str(missing_build_tools()))


def copy_sources(dest: Path) -> Path:
    dest.mkdir()
    for name in BUILD_INPUTS:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(source, dest / name)
    return dest


def build(args: List[str], cwd: Path) -> None:
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"


def pip_wheel(source: Path, out: Path) -> Path:
    """The wheel of ``source`` (a project folder or an sdist), built offline into ``out``."""
    out.mkdir()
    build(["-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", str(source), "-w", str(out)], out.parent)
    (wheel,) = out.glob("nsa-*.whl")
    return wheel


def assert_carries_profiles(wheel: Path, tmp_path: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        archive.extractall(tmp_path / "unpacked")
    carried = sorted(n.removeprefix("pytest_nsa/gpu_profiles/") for n in names if n.startswith("pytest_nsa/gpu_profiles/"))
    assert carried == source_profiles()
    assert set(NAMED) <= set(carried)
    # The wheel's own copy is where an installed plugin looks, and it loads.
    module = tmp_path / "unpacked" / "pytest_nsa" / "profiles.py"
    assert _shipped_dir(module) == module.parent / "gpu_profiles"
    assert Catalog([_shipped_dir(module)]).load("h100").name == "h100"


@needs_build_tools
def test_wheel_carries_the_shipped_profiles(tmp_path):
    project = copy_sources(tmp_path / "project")
    wheel = pip_wheel(project, tmp_path / "wheels")
    assert_carries_profiles(wheel, tmp_path)


@needs_build_tools
def test_wheel_built_from_the_sdist_carries_the_shipped_profiles(tmp_path):
    project = copy_sources(tmp_path / "project")
    sdists = tmp_path / "sdists"
    build(["-c", f"from setuptools import build_meta; build_meta.build_sdist({str(sdists)!r})"], project)
    (sdist,) = sdists.glob("nsa-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {n.split("/", 1)[1] for n in archive.getnames() if "/" in n}
    assert {f"gpu_profiles/{name}" for name in source_profiles()} <= names
    wheel = pip_wheel(sdist, tmp_path / "wheels")
    assert_carries_profiles(wheel, tmp_path)


def test_no_extra_asks_for_a_newer_triton_than_cuda_builds_of_torch_pin():
    """A CUDA build of torch pins its Triton; an extra that asks for a newer one makes pip swap
    the user's torch for one whose pin fits (with ``triton>=3.9`` in ``test``, pip chose
    2.13.0+cpu over an installed 2.14.1+cu130). Every extra admits the pins of torch 2.11-2.14."""
    from packaging.requirements import Requirement

    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")

    pins = {"2.11": "3.6.0", "2.12": "3.7.0", "2.13": "3.7.1", "2.14": "3.8.0"}
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    triton = {name: Requirement(line) for name, reqs in extras.items() for line in reqs
              if Requirement(line).name == "triton"}
    assert {"triton", "test"} <= set(triton)
    for name, req in triton.items():
        refused = {torch: pin for torch, pin in pins.items() if not req.specifier.contains(pin)}
        assert not refused, f"extra {name!r} asks for {req}, refusing the triton that torch pins: {refused}"
