"""The simulator's switching policies, by name in :data:`BUILTIN_POLICIES` (which
:mod:`prorsa_sim.catalog` offers with the baselines): ``prorsa`` (forecaster +
allocator cores on what the live system sees), ``reactive`` (load-threshold autoscaler,
+-1 engine per step), ``oracle`` (the allocator fed the true future demand) and ``bound`` (the hindsight-best
dynamic P:D schedule a search over forked simulations finds; ``bound[:<grid_s>][:beam=<B>]``).

Each takes an optional switch mode: ``prorsa:restart`` models stock SGLang 0.5.23 (it
refuses in-place switches with EP > 1, i.e. in all three paper setups); ``prorsa:in_place``
the paper's patched SGLang. Without one, a policy switches in place when the model
profile allows it (the paper's setting). ``prorsa`` and ``oracle`` also take
``paper`` first (``prorsa:paper``: the allocator's gain test as paper §4.2 states it, one
window's capacity ratio, drain and switch time as the only cost; the default prices every
switch, see docs/allocator.md, with the allocator's default ``objective = "auto"``:
holding a split whose roles keep up on a synchronous run, ``"saturation"``, and judging a
move by the capacity ratio on an asynchronous one), ``latency`` (``prorsa:latency``: the priced gain test judging each move
by the seconds a turn spends in the model on every run, ``objective = "turn_latency"``)
or ``capacity`` (``prorsa:capacity``: by the capacity ratio on every run), and ``tpot=<slack>`` (e.g. ``prorsa:tpot=0.1``, ``oracle:restart:tpot=0.1``): decode sized by step
time as well as KV, no decode step more than ``slack`` slower than an idle engine's
(the allocator's ``decode_tpot_slack``; off by default, as in the paper). Any of the
allocator's settings can follow as ``FIELD=VALUE`` (an ablation: e.g.
``prorsa:settle_s=0``, ``prorsa:capacity:served_veto_yields_to_state=false``), laid over
the defaults and the model profile's priors and validated as the allocator service's
configuration is (``AllocatorConfig``)."""

from __future__ import annotations

from collections.abc import Callable

from prorsa_allocator.config import AllocatorConfig
from pydantic import ValidationError

from ..policy import Policy
from .bound import BoundPolicy, parse_bound
from .oracle import OraclePolicy
from .prorsa import AllocatorDriver, ProrsaPolicy
from .reactive import ReactivePolicy

SWITCH_MODES = ("in_place", "restart")


def parse_spec(spec: str, options: bool = True) -> tuple[str | None, float | None]:
    """(switch mode, TPOT slack) of ``name[:paper|:latency|:capacity][:in_place|:restart][:tpot=<slack>]`` (None: default)."""
    return parse_options(spec, options)[:2]  # type: ignore[return-value]


def allocator_overrides(raw: dict[str, str]) -> dict:
    """``AllocatorConfig`` fields given as text (``FIELD`` -> ``VALUE``), validated and typed
    as the allocator service's configuration is: the fields to lay over the defaults and the
    model profile's priors. Raises ValueError naming the field and what it expects."""
    unknown = [k for k in raw if k not in AllocatorConfig.model_fields]
    if unknown:
        raise ValueError(f"{unknown[0]!r} is not a setting of the allocator (AllocatorConfig's fields, "
                         "docs/allocator.md)")
    try:
        return AllocatorConfig(**raw).model_dump(include=set(raw))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or ", ".join(raw)
        raise ValueError(f"{where}: {first['msg']}") from None


def parse_options(spec: str, options: bool = True) -> tuple[str | None, float | None, str, dict]:
    """(switch mode, TPOT slack, gain-test rule, allocator settings) of
    ``name[:paper|:latency|:capacity][:in_place|:restart][:tpot=<slack>][:FIELD=VALUE ...]``;
    the rule is ``paper``, ``latency`` / ``capacity`` (the priced rule with that objective on
    every run) or ``priced`` (the priced rule, its objective by the run's mode); the
    settings are ``AllocatorConfig`` fields (:func:`allocator_overrides`)."""
    name, *parts = spec.split(":")
    expected = f"expected {name}, {name}:in_place or {name}:restart" + (
        ", optionally :paper, :latency or :capacity first, then optionally :tpot=<slack>, then any "
        ":FIELD=VALUE of the allocator's settings" if options else "")
    mode = slack = None
    rule = "priced"
    raw: dict[str, str] = {}
    if options and parts and parts[0] in ("paper", "latency", "capacity"):
        rule, parts = parts[0], parts[1:]
    for i, part in enumerate(parts):
        if part in SWITCH_MODES and i == 0:
            mode = part
        elif options and part.startswith("tpot=") and slack is None and not raw:
            try:
                slack = float(part[len("tpot="):])
            except ValueError:
                raise ValueError(f"bad policy {spec!r}: tpot needs a number, got {part!r}") from None
            if not slack > 0 or slack == float("inf"):
                raise ValueError(f"bad policy {spec!r}: tpot slack must be a finite number > 0")
        elif options and "=" in part and not part.startswith("tpot="):
            field, _, value = part.partition("=")
            if field in raw:
                raise ValueError(f"bad policy {spec!r}: {field} is set twice ({field}={raw[field]} and {part})")
            raw[field] = value
        else:
            raise ValueError(f"bad policy {spec!r}: {expected}")
    try:
        overrides = allocator_overrides(raw) if raw else {}
    except ValueError as exc:
        raise ValueError(f"bad policy {spec!r}: {exc}") from None
    return mode, slack, rule, overrides


def parse_mode(spec: str) -> str | None:
    """The switch mode of ``name`` / ``name:in_place`` / ``name:restart`` (None: default)."""
    return parse_spec(spec, options=False)[0]


def _named(policy, spec: str):
    if ":" in spec:
        policy.name = policy.name + spec[spec.index(":"):]
    return policy


def _allocating(cls, spec: str):
    mode, slack, rule, overrides = parse_options(spec)
    driver = AllocatorDriver(switch_mode=mode, tpot_slack=slack, rule=rule, overrides=overrides or None)
    return _named(cls(driver=driver, switch_mode=mode), spec)


BUILTIN_POLICIES: dict[str, Callable[[str], Policy]] = {
    "prorsa": lambda spec: _allocating(ProrsaPolicy, spec),
    "reactive": lambda spec: _named(ReactivePolicy(switch_mode=parse_mode(spec)), spec),
    "oracle": lambda spec: _allocating(OraclePolicy, spec),
    # The hindsight-best dynamic schedule (bound.py): searched before the run, then replayed.
    "bound": parse_bound,
}
"""Each switching policy's factory: ``BUILTIN_POLICIES[name](spec)`` builds it from its CLI text."""

__all__ = ["BUILTIN_POLICIES", "BoundPolicy", "OraclePolicy", "ProrsaPolicy", "ReactivePolicy", "allocator_overrides",
           "parse_mode", "parse_options", "parse_spec"]
