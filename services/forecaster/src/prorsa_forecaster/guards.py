"""Numeric guards shared by the pure core's modules: every input array is cleaned before
use, and every sum that leaves the core is finite and non-negative."""

from __future__ import annotations

import numpy as np

BIG = 1e12  # far beyond any token count or duration; keeps products finite


def finite_sum(x: np.ndarray) -> float:
    """Sum of ``x``; 0 when it is not finite or not positive."""
    v = float(np.sum(x))
    return v if np.isfinite(v) and v > 0 else 0.0


def clean(x: np.ndarray, fill: float = 0.0) -> np.ndarray:
    """Non-finite -> ``fill``, then clipped to [0, 1e12]: guards every input array. (One
    pass of ``np.where`` and an in-place clip: ``np.nan_to_num`` gives the same values in
    two to nine times the time, the more the larger the array.)"""
    x = np.asarray(x, dtype=float)
    out = np.where(np.isfinite(x), x, fill)
    np.clip(out, 0.0, BIG, out=out)
    return out if out.ndim else out[()]  # a scalar in, a scalar out
