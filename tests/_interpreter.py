"""Triton's CPU interpreter, minus work it repeats: the language is patched once per launch.

Under ``TRITON_INTERPRET=1`` a launch patches ``triton.language`` so that its builtins run on
NumPy, runs every program, then restores it. Each call of a ``@triton.jit`` helper inside the
launch patches again (``_patch_lang``), walking the modules' members with ``inspect``, for
nothing, since the launch's patches are still in place. With Triton 3.9 that walk was about 40 %
of the whole suite's time on 2 cores (6m55s with :func:`install`, 11m30s without; the whole-op
and decode-override kernel tests alone 134 s against 210 s).

:func:`install` makes a helper's call skip that walk when every language module its function
sees (``triton.language``, ``triton.language.core``) was already patched during the current
launch; a helper that sees one not yet patched (``triton.language.standard`` calls ``core``
directly) patches as before. Nothing else changes, and the launch still restores what it patched.

Two more costs go the same way (a 2-core AMD EPYC like CI's, 2026-12: one whole-op test 12.96 s,
11.16 s without the first, 10.30 s without both; the whole suite 16m03s, then 11m57s):

- The interpreter checks every 32-bit integer ``+``, ``-`` and ``*`` for overflow: each operation
  again in int64 and two comparisons, whose result goes to an assertion that does nothing unless
  ``debug=True`` (the suite never sets it). :func:`install` turns the check off: the same values,
  nothing asserted either way, only the work gone. (The 64-bit offsets past 2**31 have GPU tests.)
- ``_get_np_dtype`` builds a table of 19 NumPy dtypes at each of its calls; it is looked up once.

It touches private names of ``triton.runtime.interpreter``; where they are missing or shaped
otherwise, :func:`install` leaves the interpreter alone and the tests run as before, only slower.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Dict, Set


def install() -> bool:
    """Wrap the interpreter's launch and language patching; returns whether it did."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    patch_lang = getattr(interpreter, "_patch_lang", None)
    scope_type = getattr(interpreter, "_LangPatchScope", None)
    executor = getattr(interpreter, "GridExecutor", None)
    if patch_lang is None or scope_type is None or executor is None or getattr(patch_lang, "_nsa_cached", False):
        return False
    if list(inspect.signature(patch_lang).parameters) != ["fn"] or not hasattr(scope_type(), "restore"):
        return False
    launch_call = executor.__call__
    depth = [0]  # launches in progress (a launch does not nest, but the count is exact anyway)
    patched: Set[int] = set()  # ids of the language modules patched during the current launch

    langs_seen: Dict[int, Set[int]] = {}  # by id of a function's globals: a module's do not move

    def langs_of(fn) -> Set[int]:
        key = id(fn.__globals__)
        if key not in langs_seen:
            langs_seen[key] = {id(value) for value in fn.__globals__.values()
                               if inspect.ismodule(value) and value in (tl, tl.core)}
        return langs_seen[key]

    def cached_patch_lang(fn):
        langs = langs_of(fn)
        if depth[0] and langs and langs <= patched:
            return scope_type()  # already patched by this launch: an empty scope, nothing to restore
        scope = patch_lang(fn)
        if depth[0]:
            patched.update(langs)
        return scope

    def counted_launch(self, *args, **kwargs):
        depth[0] += 1
        try:
            return launch_call(self, *args, **kwargs)
        finally:
            depth[0] -= 1
            if not depth[0]:
                patched.clear()

    cached_patch_lang._nsa_cached = True
    interpreter._patch_lang = cached_patch_lang
    executor.__call__ = counted_launch
    _skip_overflow_checks(interpreter)
    _look_up_numpy_dtypes(interpreter)
    return True


def _skip_overflow_checks(interpreter) -> None:
    """The interpreter's builder options without the 32-bit overflow checks, which assert nothing
    without ``debug``."""
    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if dataclasses.is_dataclass(options) and hasattr(options, "sanitize_overflow"):
        builder.options = dataclasses.replace(options, sanitize_overflow=False)


def _look_up_numpy_dtypes(interpreter) -> None:
    """``_get_np_dtype`` answered from a table of the answers it gave, by the type's class and name
    (block and pointer types are not hashable; a name spells the element type and the shape)."""
    get_np_dtype = getattr(interpreter, "_get_np_dtype", None)
    if get_np_dtype is None or getattr(get_np_dtype, "_nsa_cached", False):
        return
    answers: Dict[object, object] = {}

    def looked_up(tt_dtype):
        name = getattr(tt_dtype, "name", None)
        if not isinstance(name, str):
            return get_np_dtype(tt_dtype)
        key = (type(tt_dtype), name)
        if key not in answers:
            answers[key] = get_np_dtype(tt_dtype)
        return answers[key]

    looked_up._nsa_cached = True
    looked_up.__wrapped__ = get_np_dtype
    interpreter._get_np_dtype = looked_up
