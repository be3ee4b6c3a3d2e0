"""Shared Triton building blocks of the NSA kernels.

Each module here holds ``@triton.jit`` helpers that several ops inline, plus the
small host-side utilities their launchers share. Nothing here reads flags or
picks backends: that is :mod:`nsa.routing`'s job.
"""
