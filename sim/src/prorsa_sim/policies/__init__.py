"""Issue #6's simulator policies, registered in ``POLICY_FACTORIES`` on import (which
:func:`prorsa_sim.policy.make_policy` does on first use): ``prorsa`` (forecaster +
allocator cores on what the live system sees), ``reactive`` (load-threshold autoscaler,
+-1 engine per step) and ``oracle`` (the allocator fed the true future demand).

Each takes an optional switch mode: ``prorsa:restart`` models stock SGLang 0.5.23 (it
refuses in-place switches with EP > 1, i.e. in all three paper setups); ``prorsa:in_place``
the paper's patched SGLang. Without one, a policy switches in place when the model
profile allows it (the paper's setting)."""

from __future__ import annotations

from ..policy import POLICY_FACTORIES
from .oracle import OraclePolicy
from .prorsa import ProrsaPolicy
from .reactive import ReactivePolicy

SWITCH_MODES = ("in_place", "restart")


def parse_mode(spec: str) -> str | None:
    """The switch mode of ``name`` / ``name:in_place`` / ``name:restart`` (None: default)."""
    parts = spec.split(":")
    if len(parts) == 1:
        return None
    if len(parts) == 2 and parts[1] in SWITCH_MODES:
        return parts[1]
    raise ValueError(f"bad policy {spec!r}: expected {parts[0]}, {parts[0]}:in_place or {parts[0]}:restart")


def _named(policy, spec: str):
    mode = parse_mode(spec)
    if mode is not None:
        policy.name = f"{policy.name}:{mode}"
    return policy


POLICY_FACTORIES.setdefault("prorsa", lambda spec: _named(ProrsaPolicy(switch_mode=parse_mode(spec)), spec))
POLICY_FACTORIES.setdefault("reactive", lambda spec: _named(ReactivePolicy(switch_mode=parse_mode(spec)), spec))
POLICY_FACTORIES.setdefault("oracle", lambda spec: _named(OraclePolicy(switch_mode=parse_mode(spec)), spec))

__all__ = ["OraclePolicy", "ProrsaPolicy", "ReactivePolicy", "parse_mode"]
