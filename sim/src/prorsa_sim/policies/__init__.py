"""Issue #6's simulator policies, registered in ``POLICY_FACTORIES`` on import:
``prorsa`` (forecaster + allocator cores on what the live system sees), ``reactive``
(load-threshold autoscaler, +-1 engine per step) and ``oracle`` (the allocator fed the
true future demand). ``import prorsa_sim.policies`` before ``make_policy``."""

from __future__ import annotations

from ..policy import POLICY_FACTORIES
from .oracle import OraclePolicy
from .prorsa import ProrsaPolicy
from .reactive import ReactivePolicy

POLICY_FACTORIES.setdefault("prorsa", lambda spec: ProrsaPolicy())
POLICY_FACTORIES.setdefault("reactive", lambda spec: ReactivePolicy())
POLICY_FACTORIES.setdefault("oracle", lambda spec: OraclePolicy())

__all__ = ["OraclePolicy", "ProrsaPolicy", "ReactivePolicy"]
