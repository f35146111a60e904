"""Policies by name: what ``prorsa sim`` and the runner build from a policy's CLI text
(``colocation``, ``static:P:D``, or a switching policy ``name[:args]``).

The switching policies are :mod:`prorsa_sim.policies`' :data:`BUILTIN_POLICIES`, listed
here explicitly; :func:`register_policy` adds another.
"""

from __future__ import annotations

from collections.abc import Callable

from .policies import BUILTIN_POLICIES
from .policy import Colocation, Policy, StaticPD

POLICY_FACTORIES: dict[str, Callable[[str], Policy]] = dict(BUILTIN_POLICIES)
"""Switching policies by name: ``POLICY_FACTORIES[name](spec)`` builds one from its full CLI
text ``spec``."""

ALL_POLICIES = ("colocation", "static", "reactive", "prorsa", "oracle")
"""What ``--policies all`` runs: the baselines, then the switching policies."""


def register_policy(name: str, factory: Callable[[str], Policy]) -> None:
    """Make ``name`` (and ``name:args``) a policy :func:`make_policy` builds with ``factory(spec)``."""
    if name in ("colocation", "static") or not name or ":" in name:
        raise ValueError(f"{name!r} cannot name a policy")
    POLICY_FACTORIES[name] = factory


def policy_names() -> list[str]:
    """Every name :func:`make_policy` accepts (besides ``static:P:D``)."""
    return ["colocation", "static", *sorted(POLICY_FACTORIES)]


def expand_policies(text: str) -> list[str]:
    """The CLI's ``--policies`` list: comma-separated specs; ``all`` is :data:`ALL_POLICIES`
    (``all:restart`` asks the switching policies for restart switches)."""
    specs: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if part == "all" or part.startswith("all:"):
            suffix = part[3:]
            specs += [p if p in ("colocation", "static") or not suffix else p + suffix for p in ALL_POLICIES]
        else:
            specs.append(part)
    return specs


def make_policy(spec: str) -> Policy:
    """Build a policy from its CLI text: ``colocation``, ``static:P:D`` or a registered
    name (``name`` or ``name:args``). ``static`` alone is a sweep (see :mod:`.runner`)."""
    if spec == "colocation":
        return Colocation()
    if spec.startswith("static:"):
        parts = spec.split(":")
        if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
            raise ValueError(f"bad policy {spec!r}: expected static:P:D with integers, e.g. static:4:4")
        return StaticPD(int(parts[1]), int(parts[2]))
    base = spec.split(":", 1)[0]
    if base in POLICY_FACTORIES:
        return POLICY_FACTORIES[base](spec)
    known = ["colocation", "static", "static:P:D", *sorted(POLICY_FACTORIES)]
    raise ValueError(f"unknown policy {spec!r}; choose one of: {', '.join(known)}")
