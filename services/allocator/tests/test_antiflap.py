"""Anti-flapping: a forecast oscillating around a threshold does not cause switch after switch."""

from __future__ import annotations

from prorsa_allocator.config import AllocatorConfig
from prorsa_allocator.planner import Allocator
from prorsa_allocator.testing import THETA, forecast, registered, switched
from prorsa_schemas import EngineCommand


def _config(**kw) -> AllocatorConfig:
    """The config these tests use: the warm-up's evidence rule (``served_evidence_first``,
    tested in test_pricing.py) off, so a first forecast is acted on as the rule under test says."""
    return AllocatorConfig(**{"prefill_tokens_per_s": THETA, "served_evidence_first": False, **kw})


def run_oscillation(cfg: AllocatorConfig, low: float, high: float, windows: int = 60, n: int = 8) -> list[EngineCommand]:
    """8 in-place engines (4:4); the forecast's prefill share alternates every 10 s window
    between ``low`` and ``high`` engines' worth (decode takes the rest). Engines complete
    each command 5 s after it is issued. Returns every command issued."""
    alloc = Allocator(cfg)
    for i in range(n // 2):
        alloc.handle(registered(f"p{i}", "prefill"))
        alloc.handle(registered(f"d{i}", "decode"))
    issued: list[EngineCommand] = []
    pending: list[EngineCommand] = []
    for w in range(windows):
        t = 100.0 + 10.0 * w
        for c in pending:
            frm = "decode" if c.to_role == "prefill" else "prefill"
            alloc.handle(switched(c.engine, c.cmd, frm, c.to_role, ts=t - 5.0))
        share = low if w % 2 == 0 else high
        out = alloc.handle(forecast(t=t, prefill_engines=share, decode_engines=n - share))
        pending = [e for e in out if isinstance(e, EngineCommand)]
        issued.extend(pending)
    return issued


def reversals(cmds: list[EngineCommand]) -> int:
    roles = [c.to_role for c in cmds]
    return sum(1 for a, b in zip(roles, roles[1:]) if a != b)


THRESHOLD = 32 / 7  # prefill share at which the best split of 8 flips from 4:4 to 5:3


def test_oscillation_around_a_threshold_causes_at_most_one_switch() -> None:
    # The forecast alternates just below / just above the threshold for 10 minutes; each
    # window alone would flip the split. At most one move, never back.
    for amplitude in (0.1, 0.3):
        cmds = run_oscillation(
            _config(), THRESHOLD - amplitude, THRESHOLD + amplitude
        )
        assert len(cmds) <= 1, [(c.ts, c.engine, c.to_role) for c in cmds]


def test_large_oscillation_settles_instead_of_flapping() -> None:
    # A wide swing (3 <-> 5 engines of prefill every window). The first forecast is all the
    # allocator knows, so it may act on it and correct once; after that it holds still.
    cmds = run_oscillation(_config(), 3.0, 5.0)
    assert len(cmds) <= 2 and reversals(cmds) <= 1
    assert all(c.ts < 100.0 + 10.0 * 20 for c in cmds), "still switching after 20 windows"


def test_without_the_guards_the_same_forecast_flaps() -> None:
    # The guards are what prevents flapping: with no dwell, no hysteresis and no smoothing
    # (each window taken at face value), the same oscillation switches again and again.
    naive = _config(
        min_dwell_s=0.0, hysteresis=0.0, forecast_alpha=1.0, lookahead_windows=1
    )
    cmds = run_oscillation(naive, 3.0, 5.0)
    assert len(cmds) > 20
    assert reversals(cmds) > 20
