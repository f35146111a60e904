"""Fixtures of the tracker's tests (see :mod:`prorsa_tracker.testing`)."""

from prorsa_tracker.testing import private_pg  # noqa: F401
