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

It touches private names of ``triton.runtime.interpreter``; where they are missing or shaped
otherwise, :func:`install` leaves the interpreter alone and the tests run as before, only slower.
"""

from __future__ import annotations

import inspect
from typing import Set


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

    def langs_of(fn) -> Set[int]:
        return {id(value) for value in fn.__globals__.values() if inspect.ismodule(value) and value in (tl, tl.core)}

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
    return True
