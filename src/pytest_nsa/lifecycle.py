"""The plugin's decisions, in the order pytest asks for them.

0. :func:`engaged`: whether the run asks for the plugin at all. pytest loads it into every run of an
   environment where nsa is installed, so a run that gives none of its options is left alone: no
   torch import, no device detection, flags, xdist pinning, header lines, judged markers or baseline.
1. :func:`early` (``pytest_load_initial_conftests``, before any conftest or test
   module is imported): pin an xdist worker to its GPU, select the profile with
   the hardware that plugins can report this early, apply its flags.
2. :func:`configure` (``pytest_configure``, conftests loaded): ask the detection
   hooks again (a conftest may fake the device), re-select, re-apply if the
   answer changed, check the software, and build the :class:`~pytest_nsa.markers.Context`
   that requirement markers are judged against.
3. Cleanups registered with ``config.add_cleanup`` undo every environment change.

Every user error surfaces as ``pytest.UsageError`` naming the option, file or flag.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List, Optional, Tuple

import pytest

from pytest_nsa import env, hardware, sharing, versions, xdist
from pytest_nsa.markers import Context
from pytest_nsa.profiles import SHIPPED_DIR, Catalog, ProfileError
from pytest_nsa.selection import Selection, select
from pytest_nsa.state import STATE_KEY, NSAState, get_state
from pytest_nsa.versions import ERROR, Verdict


#: The options (``dest`` names) of the plugin and of its benchmark and report plugins. Each defaults to
#: ``None`` or ``False``, so that one given at all, on the command line, in ``addopts`` or in
#: ``PYTEST_ADDOPTS``, is told from its absence.
OPTIONS = ("gpu_profile", "gpu_profile_mismatch", "gpu_profile_list", "nsa_bench", "nsa_baseline",
           "nsa_baseline_dir", "nsa_report", "nsa_report_commit")


def engaged(options: object) -> bool:
    """Whether a run with these parsed ``options`` asks for the plugin: any of :data:`OPTIONS` given."""
    return any(getattr(options, name, None) not in (None, False) for name in OPTIONS)


def catalog_for(config: pytest.Config) -> Catalog:
    """Profiles of the project under test (``<rootdir>/gpu_profiles``) first, then the shipped ones."""
    return Catalog([Path(config.rootpath) / "gpu_profiles", SHIPPED_DIR])


def start(config: pytest.Config) -> NSAState:
    """Create the run's state from the options (idempotent)."""
    if STATE_KEY not in config.stash:
        ns = getattr(config, "known_args_namespace", config.option)
        config.stash[STATE_KEY] = NSAState(
            request=getattr(ns, "gpu_profile", None),
            on_mismatch=getattr(ns, "gpu_profile_mismatch", None) or "error",
            catalog=catalog_for(config),
            engaged=engaged(ns),
        )
    return get_state(config)


def real_hardware(config: pytest.Config) -> hardware.HardwareInfo:
    """The real detection, done once per run (it initialises CUDA)."""
    state = get_state(config)
    if state.real_hardware is None:
        state.real_hardware = hardware.detect()
    return state.real_hardware


def _select(state: NSAState, hw: hardware.HardwareInfo, on_mismatch: str) -> Selection:
    try:
        return select(state.request, hw, state.catalog, on_mismatch)
    except ProfileError as err:
        raise pytest.UsageError(f"pytest_nsa: {err}") from None


def _apply(config: pytest.Config, state: NSAState, selection: Selection) -> None:
    """Replace the applied environment with ``selection``'s (nothing when passive)."""
    if state.env is not None:
        state.env.restore()
        state.env = None
    if selection.applied:
        state.env = env.apply(selection.profile.env)
        config.add_cleanup(state.env.restore)
        if "TRITON_INTERPRET" in state.env.applied:
            state.warnings += _kernels_defined_too_early()


def _kernels_defined_too_early() -> List[str]:
    # Triton picks interpreter or compiler when a kernel is defined (at import), and nsa
    # imports kernel modules lazily; one imported already was built without the interpreter.
    early = sorted(m for m in sys.modules if m.startswith("nsa.ops.") and (m.endswith(".kernel") or "._triton" in m))
    if not early:
        return []
    return [f"{', '.join(early)} imported before the profile set TRITON_INTERPRET=1: their kernels "
            "will not use the interpreter (something imports nsa kernel modules at import time)"]


def early(config: pytest.Config) -> None:
    """``pytest_load_initial_conftests``: pin, select, apply before conftests import anything."""
    state = start(config)
    ns = config.known_args_namespace
    if not state.engaged or any(getattr(ns, name, False) for name in ("gpu_profile_list", "help", "version")):
        return
    state.pin, previous = xdist.pin(os.environ)
    if previous:
        config.add_cleanup(lambda: xdist.restore(previous, os.environ))
    state.cpu_threads = xdist.cpu_threads(os.environ, os.cpu_count() or 1)
    if state.cpu_threads is not None:
        import torch

        torch.set_num_threads(state.cpu_threads)
    if state.request in (None, "none"):
        return
    hw = config.hook.pytest_nsa_detect_hardware(config=config)
    # A mismatch is judged in configure(), once conftests can fake the device.
    selection = _select(state, hw, "skip")
    _apply(config, state, selection)
    state.hardware, state.selection = hw, selection


def _checks(selection: Selection, sw: versions.SoftwareInfo, hw: hardware.HardwareInfo) -> Tuple[Verdict, ...]:
    profile = selection.profile
    out: List[Verdict] = list(versions.check_pairing(sw, profile.software.triton_pairings, profile.name))
    if profile.device.kind == "cuda" and selection.mismatch is None:
        cuda = versions.check_cuda(hw.cuda, profile.software.cuda_min, profile.name)
        if cuda is not None:
            out.append(cuda)
    fa2 = versions.check_flash_attn(sw.flash_attn, profile.software.flash_attn, profile.name)
    return tuple(out) + ((fa2,) if fa2 is not None else ())


def _gpu_block(selection: Selection, hw: hardware.HardwareInfo) -> Optional[str]:
    if selection.mismatch is not None:
        return f"GPU tests off: {selection.mismatch} (--gpu-profile-mismatch=skip)"
    if selection.profile.device.kind == "cpu" and hw.primary is not None and selection.applied:
        return f"GPU tests off: profile {selection.profile.name} runs on the CPU"
    return None


def configure(config: pytest.Config) -> None:
    """``pytest_configure``: final hardware and profile, software checks, requirement context."""
    state = start(config)
    hw = config.hook.pytest_nsa_detect_hardware(config=config)
    sw = config.hook.pytest_nsa_detect_software(config=config)
    selection = _select(state, hw, state.on_mismatch)
    if state.selection != selection or (selection.applied and state.env is None):
        _apply(config, state, selection)
    state.hardware, state.software, state.selection = hw, sw, selection
    state.verdicts = _checks(selection, sw, hw)
    errors, warnings = env.check_user_flags()
    if selection.applied:
        problems = [f"{v.message}; fix: {v.fix}" if v.fix else v.message for v in state.verdicts if v.level == ERROR]
        problems += [f"{e} (set in your environment)" for e in errors]
        if problems:
            raise pytest.UsageError("pytest_nsa: " + "\n".join(problems))
    state.warnings += warnings if selection.applied else errors + warnings
    fa2 = next((v for v in state.verdicts if v.check == "flash-attn"), None)
    state.context = Context(hw, sw, selection.profile, _gpu_block(selection, hw), dict(os.environ), fa2)
    if getattr(config.option, "numprocesses", None) and xdist.WORKER_ENV not in os.environ:
        previous = xdist.publish(hw.gpu_count, os.environ)
        if previous:
            config.add_cleanup(lambda: xdist.restore(previous, os.environ))
        locks = sharing.publish(os.environ)
        if locks is not None:
            config.add_cleanup(lambda: sharing.remove(locks, os.environ))
    state.turns = sharing.turns_for(state.pin, os.environ)
    if state.turns is not None:
        config.pluginmanager.register(state.turns, "pytest_nsa_device_turns")
