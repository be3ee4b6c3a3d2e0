"""xdist workers that share one GPU take turns with the memory-hungry tests.

With more xdist workers than GPUs, several workers run tests on one device at once.
A test that needs most of the device's memory then fails with out-of-memory errors
that it would not have alone, and so do the tests beside it (three workers on one
80 GB H100: the 64k long-context test took 50 GiB and it and two kernel tests failed).

So on a worker that shares its device, every test holds a lock on the device for its
whole run (setup, call and teardown): a shared lock for ordinary tests, an exclusive
one for the tests that need the whole device (marked ``long_context``, ``exclusive``
(a test that times the device), or ``requires(memory_gib=...)``). Those run alone on the
device while the other workers' tests wait, and after every test the worker gives its
cached CUDA memory back. The locks are ``flock`` locks on files of a per-session directory that the
controller publishes in :data:`LOCK_DIR_ENV`. A gate file keeps a waiting exclusive
test from being starved: it holds the gate while it waits, and every test passes the
gate before it takes its shared lock. Where ``fcntl`` is missing (Windows), nothing
is locked.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, List, Mapping, MutableMapping, Optional

import pytest

from pytest_nsa.gpu_memory import allocated_after_collecting, cuda_in_use, reset_driver_stack
from pytest_nsa.xdist import WORKER_COUNT_ENV, WORKER_ENV, Pin

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

#: Set by the controller for its workers: the directory of this session's device locks.
LOCK_DIR_ENV = "PYTEST_NSA_LOCK_DIR"


def workers_on_device(pin: Optional[Pin], environ: Mapping[str, str]) -> int:
    """How many workers (this one included) run on this worker's device: worker ``gwI``
    gets ``pool[I % len(pool)]``, so those with the same ``I % len(pool)``."""
    if pin is None:
        return 1
    count = int(environ.get(WORKER_COUNT_ENV) or 1)
    mine = int(pin.worker[2:]) % len(pin.pool)
    return sum(1 for i in range(count) if i % len(pin.pool) == mine)


def needs_whole_device(item: pytest.Item) -> bool:
    """Whether ``item`` must run alone on its device: ``long_context``, ``exclusive`` or
    ``requires(memory_gib=...)``."""
    for mark in item.iter_markers():
        if mark.name in ("long_context", "exclusive"):
            return True
        if mark.name == "requires" and mark.kwargs.get("memory_gib") is not None:
            return True
    return False


def whole_device_tests_last(items: List[pytest.Item], pin: Optional[Pin], environ: Mapping[str, str]) -> bool:
    """Where xdist workers share GPUs (more workers than GPUs in the pool), move the tests that
    need a whole device (:func:`needs_whole_device`) to the end of ``items``, each group in its
    order; returns whether any moved.

    Why: such a test waits for every test in flight on its GPU, and the tests that arrive
    meanwhile queue behind it, so each one holds up every worker of its GPU for up to the
    longest test in flight. On an H100 with 12 workers the workers waited 119-152 s each in a 348-s
    run (session 25); at the end of the session fewer tests are left to hold up. Measured since
    (session 26, 12 workers, other tests): 106-142 s and 69-201 s. The waits are mostly the
    whole-device tests' own run time, which every other worker sits out wherever they run, so the
    order moves them little; it stays (exact and cheap), though no run has shown it shortening them.
    Every worker decides from the
    same worker count and pool, so all collect the same order, as xdist requires."""
    if pin is None or WORKER_ENV not in environ or int(environ.get(WORKER_COUNT_ENV) or 1) <= len(pin.pool):
        return False
    alone = [needs_whole_device(item) for item in items]
    order = [item for item, last in zip(items, alone) if not last] + [item for item, last in zip(items, alone) if last]
    if order == items:
        return False
    items[:] = order
    return True


class DeviceLock:
    """Shared/exclusive turns on one device, between processes: ``<dir>/gpu-<device>.lock``
    and its gate ``<dir>/gpu-<device>.gate``. Each hold opens its own file descriptions,
    so holds of one process exclude each other like those of different processes."""

    def __init__(self, directory: Path, device: str) -> None:
        name = "gpu-" + "".join(c if c.isalnum() else "_" for c in device)
        self.lock_path = directory / f"{name}.lock"
        self.gate_path = directory / f"{name}.gate"

    @contextlib.contextmanager
    def hold(self, exclusive: bool, blocking: bool = True) -> Iterator[None]:
        """Hold the device, alone (``exclusive``) or beside other shared holders.
        Without ``blocking``, raise ``BlockingIOError`` instead of waiting."""
        wait = 0 if blocking else fcntl.LOCK_NB
        with open(self.gate_path, "a") as gate, open(self.lock_path, "a") as lock:
            fcntl.flock(gate, fcntl.LOCK_EX | wait)
            try:
                # an exclusive holder keeps the gate until it has the device, so shared
                # holders arriving meanwhile queue behind it instead of overtaking it
                fcntl.flock(lock, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | wait)
            finally:
                fcntl.flock(gate, fcntl.LOCK_UN)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


def release_cached_gpu_memory() -> None:
    """Give this process's cached, unused CUDA memory back to the device. A worker's
    allocator otherwise keeps what its biggest test took (50 GiB after the 64k
    long-context test), and the turn of the next memory-hungry test, or the tests of
    the other workers, would run out of memory beside it.

    Before emptying the cache, free what only a failed test's frames hold: pytest keeps the
    last error in ``sys.last_*`` (for post-mortem debugging) until the next test's call, so its
    tensors would stay allocated while this worker waits for its next turn; and tensors that
    only reference cycles hold (collected where much is still allocated). After it, give back the
    local memory the driver reserved for spilling kernels (:func:`~pytest_nsa.gpu_memory.reset_driver_stack`)."""
    cuda = cuda_in_use()
    if cuda is None:
        return
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            delattr(sys, name)
    allocated_after_collecting()
    cuda.empty_cache()
    # The local memory the driver keeps for spilling kernels' stacks (13.7 GiB after one float32
    # test at head dim 192 on an H100) is no cache of torch's: reset the limit to free it.
    reset_driver_stack()


class DeviceTurns:
    """Registered on a worker that shares its device: every test holds :class:`DeviceLock`,
    exclusively where :func:`needs_whole_device`, and leaves no cached CUDA memory behind
    (:func:`release_cached_gpu_memory`). Counts what it did for the worker note."""

    def __init__(self, lock: DeviceLock, sharing: int) -> None:
        self.lock = lock
        self.sharing = sharing
        self.alone = 0
        self.waited_s = 0.0

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: Optional[pytest.Item]) -> Iterator[Any]:
        if item.get_closest_marker("skip") is not None:  # skipped at collection: touches nothing
            yield
            return
        exclusive = needs_whole_device(item)
        start = time.monotonic()
        with self.lock.hold(exclusive):
            self.waited_s += time.monotonic() - start
            self.alone += exclusive
            try:
                yield
            finally:
                release_cached_gpu_memory()

    def describe(self) -> str:
        return (f"device shared by {self.sharing} workers: {self.alone} tests ran alone on it "
                f"(memory-hungry or timed), {self.waited_s:.1f} s spent waiting for turns")


def turns_for(pin: Optional[Pin], environ: Mapping[str, str]) -> Optional[DeviceTurns]:
    """The turns of this process, if it is a worker sharing its device in a session that
    published a lock directory (and ``fcntl`` exists); else ``None``."""
    directory = environ.get(LOCK_DIR_ENV)
    sharing = workers_on_device(pin, environ)
    if pin is None or fcntl is None or not directory or sharing < 2 or WORKER_ENV not in environ:
        return None
    Path(directory).mkdir(parents=True, exist_ok=True)  # a directory the user named may not exist yet
    return DeviceTurns(DeviceLock(Path(directory), pin.device), sharing)


def publish(environ: MutableMapping[str, str]) -> Optional[Path]:
    """On the controller: create this session's lock directory and publish it for the
    workers. A directory the user set wins (then concurrent sessions that set the same one
    take turns with each other too). Returns the directory created, if any."""
    if environ.get(LOCK_DIR_ENV):
        return None
    directory = Path(tempfile.mkdtemp(prefix="pytest-nsa-locks-"))
    environ[LOCK_DIR_ENV] = str(directory)
    return directory


def remove(directory: Path, environ: MutableMapping[str, str]) -> None:
    """Undo :func:`publish`: drop the variable and the lock files."""
    if environ.get(LOCK_DIR_ENV) == str(directory):
        del environ[LOCK_DIR_ENV]
    for path in directory.glob("*"):
        with contextlib.suppress(OSError):
            path.unlink()
    with contextlib.suppress(OSError):
        os.rmdir(directory)
