"""The window loop: event time -> one forecast per window, and each window's actuals.

Exactly what a forecast may see: the forecast for window [t, t+S) is made from every
event with ``ts < t`` (events at exactly ``t`` belong to the window, not its past).
Windows start at the first event's ``ts`` rounded down to a multiple of S and step by S
(shared/EVENTS.md, "What a forecast is measured against"). Actuals:

* prefill: prompt tokens of every request queued in [t, t+S), plus those waiting in the
  ready queue or in prefill at t (queued before t, no ``prefill.finished`` before t);
* decode admissions: prompt tokens of every request whose ``prefill.finished`` falls in
  [t, t+S) (the prompt of the ``request.queued`` with the same traj and req).

When a window closes, it feeds the online correction and the blend
(``History.correction``, terms/correction.py), so only windows that ended at or before t
ever influence the forecast for t.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from prorsa_schemas import Event

from .config import ForecastConfig
from .core import Forecast, forecast
from .snapshot import Snapshot
from .state import LiveState
from .trajstate import ABORTED, DECODE, PREFILL, QUEUED, START, TOOL

SOURCES = ("sampler", "sandbox", "tool", "reprefill", "other")


class ActualsMeter:
    """Measures a window's actual prefill demand and decode admissions from events."""

    def __init__(self) -> None:
        # (run, traj) -> (req, prompt, window count when queued)
        self._open: dict[tuple[str, str], tuple[str, float, int]] = {}
        self.backlog = 0.0
        self.arrivals = 0.0
        self.admissions = 0.0
        self.admissions_known = 0.0
        """Admissions of requests already queued at the window's start."""
        self._window = 0

    def start_window(self) -> float:
        """Reset the window's counters; returns the backlog (ready + prefill) at its start."""
        self.arrivals = 0.0
        self.admissions = 0.0
        self.admissions_known = 0.0
        self._window += 1
        return self.backlog

    def _close(self, key: tuple[str, str]) -> tuple[str, float, int] | None:
        old = self._open.pop(key, None)
        if old is not None:
            self.backlog -= old[1]
        return old

    def apply(self, ev: Event) -> None:
        kind = ev.type
        if kind == "request.queued":
            key = (ev.run, ev.traj)
            self._close(key)  # a re-queue replaces the trajectory's earlier request
            self._open[key] = (ev.req, float(ev.prompt_tokens), self._window)
            self.backlog += ev.prompt_tokens
            self.arrivals += ev.prompt_tokens
        elif kind == "prefill.finished":
            key = (ev.run, ev.traj)
            cur = self._open.get(key)
            if cur is not None and cur[0] == ev.req:
                self._close(key)
                self.admissions += cur[1]
                if cur[2] < self._window:
                    self.admissions_known += cur[1]
        elif kind in ("trajectory.dropped", "reward.finished", "decode.finished"):
            # The request (if any) left the ready queue / prefill without a prefill.finished
            # (aborted or never observed): it no longer counts as backlog.
            key = (ev.run, ev.traj)
            if kind != "decode.finished" or (key in self._open and self._open[key][0] == ev.req):
                self._close(key)


@dataclass(frozen=True)
class WindowResult:
    """A closed window: the forecast made at its start and what actually happened."""

    t: float
    horizon: float
    forecast: Forecast
    prefill_actual: float
    decode_actual: float
    backlog: float
    sources: dict[str, float]
    prefill_sd: float | None = None
    """Spread of the window's predicted arrivals (``uncertainty.prefill_sd``), when the
    loop was asked for it."""
    decode_known: float = 0.0
    """The part of ``decode_actual`` from requests queued before t."""
    decode_sd: float | None = None
    """Spread of the window's decode admissions (``uncertainty.decode_sd``), likewise."""


class TrackerGate:
    """Passes each event through the tracker's pure core (prorsa_tracker.core.apply).

    An event the tracker ignores (a duplicate id) or rejects (an illegal transition:
    recorded there as an anomaly) does not reach the forecaster's state or the actuals,
    so the forecaster sees exactly the canonical lifecycle the tracker publishes.
    """

    def __init__(self) -> None:
        from prorsa_tracker import core

        self._core = core
        self.state = core.new_state()
        self.rejected = 0

    def accept(self, ev: Event) -> bool:
        before = self.state.duplicates
        _, transitions, anomalies = self._core.apply(self.state, ev)
        if self.state.duplicates != before:
            self.rejected += 1
            return False
        if hasattr(ev, "traj") and not transitions:
            self.rejected += 1
            return False
        return True


class WindowLoop:
    """Feeds events to the live state and the meter; closes windows as event time passes.

    With ``gate=True`` (the default) events go through the tracker core first
    (:class:`TrackerGate`); ``gate=False`` folds every valid event directly.
    """

    def __init__(
        self, config: ForecastConfig | None = None, state: LiveState | None = None, gate: bool = True,
        spread: bool = False, max_gap_windows: int | None = None,
    ) -> None:
        self.gate = TrackerGate() if gate else None
        self.config = config or (state.config if state else ForecastConfig())
        self.state = state or LiveState(self.config)
        self.meter = ActualsMeter()
        self._t0: float | None = None
        self._k = 0
        self._current: Forecast | None = None
        self._backlog = 0.0
        self.last_ts = -math.inf
        self.out_of_order = 0
        # Every forecast made, in order, until a consumer (the service) takes them.
        self.opened: deque[Forecast] = deque(maxlen=100_000)
        self._wstate = None
        self._sources: dict[str, float] = {}
        self._arrivals_by_step: list[float] = []
        self.spread = spread
        # Live: the most windows one advance closes one by one (None: all, as an offline
        # replay must to score every window); past it the gap is skipped (``skipped``).
        self.max_gap_windows = max_gap_windows
        self.skipped = 0
        self._sd: float | None = None
        self._dsd: float | None = None

    def _source_of(self, ev) -> str:
        """Which forecast source an arrival in the current window belongs to."""
        st = self.state
        i = st.slot_of(ev)
        t = self.window_start
        if i is None:
            return "other"  # a trajectory never dispatched in this log
        if st.dispatched_at[i] >= t or i >= len(self._wstate):
            return "sampler"
        was = int(self._wstate[i])
        if st.state[i] == ABORTED:
            # Aborted (a weight update, a drain) and re-queued. The forecast counts all of
            # the re-prefills in one term, whatever each was at t: a pending update's (the
            # decoding set at t stands in for the set when it lands; the turns it cuts are
            # not forecast as tool returns) and those of the requests already aborted, or
            # under way when the last update landed (terms.update.requeues).
            return "reprefill"
        return {START: "sandbox", TOOL: "tool", QUEUED: "tool", PREFILL: "tool", DECODE: "tool"}.get(was, "other")

    @property
    def window_start(self) -> float | None:
        return None if self._t0 is None else self._t0 + self._k * self.config.horizon

    def _snapshot(self, t: float) -> Snapshot:
        """The snapshot a window's forecast is made from (a hook for diagnostics)."""
        return self.state.snapshot(t)

    def _open(self) -> None:
        t = self.window_start
        assert t is not None
        snap = self._snapshot(t)
        self._current = forecast(snap, self.state.history, self.config)
        if self.spread:
            from .uncertainty import decode_sd, prefill_sd

            self._sd = prefill_sd(snap, self.state.history, self.config)
            self._dsd = decode_sd(snap, self.state.history, self.config, self._current.admit_detail)
        self.opened.append(self._current)
        self._backlog = self.meter.start_window()
        # Each trajectory's state at t, to attribute the window's arrivals to a source.
        self._wstate = self.state.state[: self.state.n].copy()
        self._sources = dict.fromkeys(SOURCES, 0.0)
        self._arrivals_by_step = [0.0] * self.config.steps

    def _close(self, reopen: bool = True) -> WindowResult:
        f = self._current
        assert f is not None
        prefill = self._backlog + self.meter.arrivals
        decode = self.meter.admissions
        known = self.meter.admissions_known
        self.state.history.correction.learn(f, prefill, decode, known, self._sources, self._arrivals_by_step)
        res = WindowResult(f.t, f.horizon, f, prefill, decode, self._backlog, self._sources, self._sd, known, self._dsd)
        self._k += 1
        if reopen:
            self._open()
        return res

    def advance(self, ts: float) -> list[WindowResult]:
        """Close every window that ends at or before ``ts`` (all events before ts are in)."""
        out: list[WindowResult] = []
        if self._t0 is None or not math.isfinite(ts):
            return out
        S = self.config.horizon
        gap = math.floor((ts - self._t0) / S) - self._k  # windows that end at or before ts
        if self.max_gap_windows is not None and gap > self.max_gap_windows:
            # A long jump (a quiet bus, a stream whose clocks disagree): close the current
            # window and reopen at ts, with no forecast for the windows between: closing
            # each would take the loop ~2 ms a window (an hour at S = 1 s: seconds), and
            # none would be fresh enough for the allocator to act on.
            out.append(self._close(reopen=False))  # (the next window's index now)
            self.skipped += gap - 1
            self._k += gap - 1
            self._open()
            return out
        while ts >= self._t0 + (self._k + 1) * S:
            out.append(self._close())
        return out

    def feed(self, ev: Event) -> list[WindowResult]:
        """Apply one event (in ``ts`` order); returns the windows it closed."""
        if self.gate is not None and not self.gate.accept(ev):
            return self.advance(ev.ts) if self._t0 is not None else []
        if self._t0 is None:
            S = self.config.horizon
            self._t0 = math.floor(ev.ts / S) * S
            self._open()
        if ev.ts < self.last_ts:
            # Out of order breaks the contract; still applied (losing it would be worse).
            self.out_of_order += 1
        closed = self.advance(ev.ts)
        self.last_ts = max(self.last_ts, ev.ts)
        if ev.type == "request.queued":
            self._sources[self._source_of(ev)] += ev.prompt_tokens
            steps = len(self._arrivals_by_step)
            if steps:
                k = int((ev.ts - self.window_start) / (self.config.horizon / steps))
                self._arrivals_by_step[min(max(k, 0), steps - 1)] += ev.prompt_tokens
        self.state.apply(ev)
        self.meter.apply(ev)
        return closed

    def finish(self) -> list[WindowResult]:
        """Close the window holding the last event (the end of a log)."""
        if self._t0 is None:
            return []
        res = self._close(reopen=False)
        self._t0 = None
        return [res]


def replay(
    events: Iterable[Event], config: ForecastConfig | None = None, gate: bool = True
) -> Iterator[WindowResult]:
    """Run the window loop over events in order; yields every window, the last one included."""
    loop = WindowLoop(config, gate=gate)
    for ev in events:
        yield from loop.feed(ev)
    yield from loop.finish()
