"""Comparison helpers for tests: relative errors against a higher-precision reference."""

from __future__ import annotations

import torch


def rel_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``||actual - expected|| / ||expected||`` in float64 (NaN anywhere gives ``inf``).

    A zero reference compares by the absolute norm of ``actual``.
    """
    a, e = actual.detach().double(), expected.detach().double()
    if a.shape != e.shape:
        raise ValueError(f"shapes differ: {tuple(a.shape)} vs {tuple(e.shape)}")
    if not torch.isfinite(a).all() or not torch.isfinite(e).all():
        return float("inf")
    denom = e.norm().item()
    diff = (a - e).norm().item()
    return diff / denom if denom > 0 else diff


def assert_close(name: str, actual: torch.Tensor, expected: torch.Tensor, tol: float) -> None:
    """Fail with the relative error when ``rel_error(actual, expected) > tol``."""
    err = rel_error(actual, expected)
    if not err <= tol:
        raise AssertionError(f"{name}: relative error {err:.3e} exceeds {tol:.1e}")
