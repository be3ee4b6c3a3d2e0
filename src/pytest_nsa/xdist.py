"""pytest-xdist support: one GPU per worker, a fair share of the CPU, and worker notes
gathered on the controller.

The CUDA runtime reads ``CUDA_VISIBLE_DEVICES`` once, when it starts, so a worker
must be pinned before anything touches CUDA, i.e. before its config exists
(``config.workerinput`` arrives too late). xdist sets ``PYTEST_XDIST_WORKER``
before creating the worker's config, and workers inherit the controller's
environment; so the controller publishes its device pool in
:data:`POOL_ENV` and each worker takes ``pool[index % len(pool)]`` in
``pytest_load_initial_conftests``. The pool is the outer ``CUDA_VISIBLE_DEVICES``
when set (ids or UUIDs, kept as written), else ``0 .. count-1``.

Each worker's torch also gets ``cores // workers`` intra-op threads (:func:`cpu_threads`): by
default every worker would start one thread a core, and ``n`` workers on ``n`` cores then
oversubscribe them (2 workers on 2 cores, the interpreter's decode tests: 79 s, and 74 s with
one thread each through ``OMP_NUM_THREADS=1``, before this module set them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, Mapping, MutableMapping, Optional, Tuple

#: Set by the controller for its workers: comma-separated devices to share out.
POOL_ENV = "PYTEST_NSA_GPU_POOL"
WORKER_ENV = "PYTEST_XDIST_WORKER"
#: Set by xdist in every worker: how many workers run.
WORKER_COUNT_ENV = "PYTEST_XDIST_WORKER_COUNT"
_WORKER_RE = re.compile(r"^gw(\d+)$")


@dataclass(frozen=True)
class Pin:
    """A worker's device: ``worker`` (e.g. ``"gw1"``) gets ``device`` out of ``pool``."""

    worker: str
    device: str
    pool: Tuple[str, ...]

    def describe(self) -> str:
        return f"{self.worker} -> CUDA_VISIBLE_DEVICES={self.device} (pool {','.join(self.pool)})"


def _split(text: Optional[str]) -> Tuple[str, ...]:
    return tuple(part.strip() for part in (text or "").split(",") if part.strip())


def pool_for(gpu_count: int, environ: Mapping[str, str]) -> Tuple[str, ...]:
    """The devices the controller shares out: the outer ``CUDA_VISIBLE_DEVICES``
    entries (as many as GPUs are visible) or ``"0" .. str(gpu_count - 1)``."""
    outer = _split(environ.get("CUDA_VISIBLE_DEVICES"))
    if outer:
        return outer[:gpu_count] if gpu_count else ()
    return tuple(str(i) for i in range(gpu_count))


def plan(environ: Mapping[str, str]) -> Optional[Pin]:
    """The pin of this process if it is an xdist worker with a known pool, else ``None``."""
    worker = environ.get(WORKER_ENV, "")
    match = _WORKER_RE.match(worker)
    if match is None:
        return None
    pool = _split(environ.get(POOL_ENV)) or _split(environ.get("CUDA_VISIBLE_DEVICES"))
    if not pool:
        return None
    return Pin(worker, pool[int(match.group(1)) % len(pool)], pool)


def pin(environ: MutableMapping[str, str]) -> Tuple[Optional[Pin], Dict[str, Optional[str]]]:
    """Pin this worker (set ``CUDA_VISIBLE_DEVICES``); return the pin and the previous values."""
    chosen = plan(environ)
    if chosen is None:
        return None, {}
    previous = {"CUDA_VISIBLE_DEVICES": environ.get("CUDA_VISIBLE_DEVICES")}
    environ["CUDA_VISIBLE_DEVICES"] = chosen.device
    return chosen, previous


def cpu_threads(environ: Mapping[str, str], cores: int) -> Optional[int]:
    """Intra-op CPU threads for this process if it is an xdist worker: the ``cores`` shared out
    evenly, at least one each. None outside a worker, or where the user chose
    (``OMP_NUM_THREADS`` set)."""
    if _WORKER_RE.match(environ.get(WORKER_ENV, "")) is None or environ.get("OMP_NUM_THREADS", "").strip():
        return None
    try:
        workers = int(environ.get(WORKER_COUNT_ENV, ""))
    except ValueError:
        return None
    return max(1, cores // workers) if workers > 0 else None


def restore(previous: Mapping[str, Optional[str]], environ: MutableMapping[str, str]) -> None:
    """Put back the variables :func:`pin` or :func:`publish` changed."""
    for name, value in previous.items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value


def publish(gpu_count: int, environ: MutableMapping[str, str]) -> Dict[str, Optional[str]]:
    """On the controller: publish the pool for the workers (a pool the user set wins)."""
    pool = pool_for(gpu_count, environ)
    if not pool or environ.get(POOL_ENV, "").strip():
        return {}
    previous = {POOL_ENV: environ.get(POOL_ENV)}
    environ[POOL_ENV] = ",".join(pool)
    return previous


def workers(config: Any) -> int:
    """xdist workers of this run (0 without xdist); ``-n auto`` is resolved into ``tx`` by then."""
    if getattr(config.option, "dist", "no") == "no":
        return 0
    return len(getattr(config.option, "tx", None) or ())


class XdistHooks:
    """Registered only when pytest-xdist is loaded (its hook names are unknown otherwise)."""

    def __init__(self, notes: Dict[str, str]) -> None:
        self.notes = notes

    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """Controller: keep what the worker reported about its device."""
        note = getattr(node, "workeroutput", {}).get("pytest_nsa")
        if note:
            self.notes[node.gateway.id] = note
