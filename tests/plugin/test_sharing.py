"""Workers that share a GPU take turns with memory-hungry tests (``pytest_nsa.sharing``)."""

from __future__ import annotations

import textwrap

import pytest

from pytest_nsa import sharing
from pytest_nsa.xdist import Pin

pytestmark = pytest.mark.skipif(sharing.fcntl is None, reason="no fcntl file locks on this platform")


def test_workers_on_device_counts_the_workers_of_one_pool_entry():
    one_gpu = Pin("gw1", "0", ("0",))
    assert sharing.workers_on_device(one_gpu, {sharing.WORKER_COUNT_ENV: "3"}) == 3
    two_gpus = Pin("gw2", "1", ("0", "1"))  # gw0, gw2, gw4 on "0"; gw1, gw3 on "1"
    assert sharing.workers_on_device(Pin("gw4", "0", ("0", "1")), {sharing.WORKER_COUNT_ENV: "5"}) == 3
    assert sharing.workers_on_device(Pin("gw3", "1", ("0", "1")), {sharing.WORKER_COUNT_ENV: "5"}) == 2
    assert sharing.workers_on_device(two_gpus, {sharing.WORKER_COUNT_ENV: "2"}) == 1
    assert sharing.workers_on_device(None, {sharing.WORKER_COUNT_ENV: "4"}) == 1


def test_turns_only_for_a_worker_that_shares_its_device(tmp_path):
    pin = Pin("gw0", "0", ("0",))
    env = {sharing.LOCK_DIR_ENV: str(tmp_path), sharing.WORKER_COUNT_ENV: "2", "PYTEST_XDIST_WORKER": "gw0"}
    turns = sharing.turns_for(pin, env)
    assert turns is not None and turns.sharing == 2
    assert sharing.turns_for(pin, dict(env, **{sharing.WORKER_COUNT_ENV: "1"})) is None  # alone on it
    assert sharing.turns_for(None, env) is None  # not pinned
    assert sharing.turns_for(pin, {k: v for k, v in env.items() if k != sharing.LOCK_DIR_ENV}) is None


def test_exclusive_hold_excludes_shared_ones_and_the_reverse(tmp_path):
    lock, other = sharing.DeviceLock(tmp_path, "0"), sharing.DeviceLock(tmp_path, "0")
    with lock.hold(exclusive=False):
        with other.hold(exclusive=False, blocking=False):  # shared beside shared
            pass
        with pytest.raises(BlockingIOError):
            with other.hold(exclusive=True, blocking=False):
                pass
    with lock.hold(exclusive=True):
        with pytest.raises(BlockingIOError):
            with other.hold(exclusive=False, blocking=False):
                pass
    with sharing.DeviceLock(tmp_path, "1").hold(exclusive=True, blocking=False):  # another device
        with lock.hold(exclusive=True, blocking=False):
            pass


def test_a_waiting_exclusive_hold_keeps_new_shared_ones_out(tmp_path):
    """The gate: while an exclusive hold waits for the device, it holds the gate, so a shared
    hold that arrives then cannot overtake it (here: the gate is taken by hand)."""
    import fcntl

    lock = sharing.DeviceLock(tmp_path, "0")
    with open(lock.gate_path, "a") as gate:
        fcntl.flock(gate, fcntl.LOCK_EX)
        with pytest.raises(BlockingIOError):
            with lock.hold(exclusive=False, blocking=False):
                pass
        fcntl.flock(gate, fcntl.LOCK_UN)
    with lock.hold(exclusive=False, blocking=False):
        pass


def test_memory_hungry_tests_run_alone_on_a_shared_device(pytester, fake, subprocess, monkeypatch):
    """Two workers on one (faked) GPU: while a long_context, exclusive or requires(memory_gib=...)
    test runs, no other test runs; ordinary tests do run side by side."""
    fake("a100")
    monkeypatch.setenv("PYTEST_NSA_GPU_POOL", "0")
    log = pytester.path / "intervals.log"
    pytester.makepyfile(test_x=textwrap.dedent(f'''
        import os
        import time
        import pytest

        LOG = {str(log)!r}

        def _run(name, seconds):
            with open(LOG, "a") as f:
                f.write(f"start {{name}} {{time.monotonic()}}\\n")
            time.sleep(seconds)
            with open(LOG, "a") as f:
                f.write(f"end {{name}} {{time.monotonic()}}\\n")

        @pytest.mark.parametrize("i", range(12))
        def test_small(i):
            _run(f"small{{i}}", 0.1)

        @pytest.mark.long_context
        def test_long():
            _run("long", 0.5)

        @pytest.mark.requires(memory_gib=40)
        def test_big():
            _run("big", 0.5)

        @pytest.mark.exclusive
        def test_timed():
            _run("timed", 0.5)
    '''))
    result = subprocess("-n", "2", "--gpu-profile", "a100")
    result.assert_outcomes(passed=15)
    result.stdout.fnmatch_lines(["gw*: gw* -> CUDA_VISIBLE_DEVICES=0 (pool 0); *device shared by 2 workers*"])
    spans = {}
    for line in log.read_text().splitlines():
        what, name, t = line.split()
        spans.setdefault(name, {})[what] = float(t)
    assert len(spans) == 15 and all(len(s) == 2 for s in spans.values())
    for alone in ("long", "big", "timed"):
        a = spans[alone]
        overlapping = [n for n, s in spans.items() if n != alone and s["start"] < a["end"] and a["start"] < s["end"]]
        assert overlapping == [], f"{alone} ran beside {overlapping}"
    small = sorted((s["start"], s["end"]) for n, s in spans.items() if n.startswith("small"))
    assert any(b[0] < a[1] for a, b in zip(small, small[1:])), "ordinary tests never ran side by side"


def test_whole_device_tests_go_last_where_workers_share_a_gpu(pytester):
    """Where more workers than GPUs run, the long_context, exclusive and requires(memory_gib=...)
    tests move to the end of the collection in their order, the others keep theirs; alone on a GPU,
    or outside xdist, nothing moves."""
    items = pytester.getitems(textwrap.dedent('''
        import pytest

        def test_a(): pass

        @pytest.mark.long_context
        def test_long(): pass

        def test_b(): pass

        @pytest.mark.requires(memory_gib=40)
        def test_big(): pass

        @pytest.mark.requires(sm=">=8.0")
        def test_c(): pass

        @pytest.mark.exclusive
        def test_timed(): pass

        def test_d(): pass
    '''))
    names = [item.name for item in items]
    shared = {sharing.WORKER_COUNT_ENV: "3", "PYTEST_XDIST_WORKER": "gw1"}
    moved = list(items)
    assert sharing.whole_device_tests_last(moved, Pin("gw1", "0", ("0",)), shared)
    assert [item.name for item in moved] == ["test_a", "test_b", "test_c", "test_d", "test_long", "test_big", "test_timed"]
    assert not sharing.whole_device_tests_last(moved, Pin("gw1", "0", ("0",)), shared)  # already last
    for pin, env in [(Pin("gw1", "1", ("0", "1", "2")), shared),  # a GPU each
                     (None, shared),  # not pinned
                     (Pin("gw1", "0", ("0",)), {sharing.WORKER_COUNT_ENV: "3"})]:  # not a worker
        kept = list(items)
        assert not sharing.whole_device_tests_last(kept, pin, env)
        assert [item.name for item in kept] == names


def test_every_turn_gives_cached_gpu_memory_back(tmp_path, monkeypatch):
    """After a test, a sharing worker drops pytest's record of the last error and empties torch's
    CUDA cache (where CUDA is in use), so the memory a test took is free for the next turn;
    without CUDA it does nothing."""
    import sys
    import types

    calls = []
    cuda = types.SimpleNamespace(is_initialized=lambda: True, empty_cache=lambda: calls.append("empty"),
                                 memory_allocated=lambda: 0)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    turns = sharing.DeviceTurns(sharing.DeviceLock(tmp_path, "0"), sharing=2)
    item = types.SimpleNamespace(get_closest_marker=lambda name: None, iter_markers=lambda: iter(()))
    protocol = turns.pytest_runtest_protocol(item, None)
    next(protocol)
    assert calls == []  # not during the test
    # a failed test's error, which pytest keeps for post-mortem debugging, holds its tensors: dropped
    sys.last_value, sys.last_traceback = ValueError("failed"), None
    with pytest.raises(StopIteration):
        next(protocol)
    assert calls == ["empty"] and not hasattr(sys, "last_value") and not hasattr(sys, "last_traceback")
    cuda.is_initialized = lambda: False
    sharing.release_cached_gpu_memory()
    assert calls == ["empty"]


def test_a_lock_dir_the_user_names_is_kept_and_created(tmp_path):
    named = tmp_path / "shared-locks"
    environ = {sharing.LOCK_DIR_ENV: str(named)}
    assert sharing.publish(environ) is None and environ[sharing.LOCK_DIR_ENV] == str(named)
    env = dict(environ, **{sharing.WORKER_COUNT_ENV: "2", "PYTEST_XDIST_WORKER": "gw1"})
    turns = sharing.turns_for(Pin("gw1", "0", ("0",)), env)
    assert turns is not None and named.is_dir()
    with turns.lock.hold(exclusive=True, blocking=False):
        pass


def test_publish_creates_and_remove_deletes_the_session_lock_dir():
    environ = {}
    directory = sharing.publish(environ)
    assert directory is not None and directory.is_dir() and environ[sharing.LOCK_DIR_ENV] == str(directory)
    with sharing.DeviceLock(directory, "0").hold(exclusive=False):
        pass
    sharing.remove(directory, environ)
    assert not directory.exists() and sharing.LOCK_DIR_ENV not in environ
