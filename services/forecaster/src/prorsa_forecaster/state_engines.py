"""The engine side of :class:`~prorsa_forecaster.state.LiveState`: engine roles and
data-parallel sizes, decode KV in use, prefix-cache expectations, the weight-sync pause.

A mixin, so that the fold stays one object (one set of slot arrays) while its modules
stay short.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from functools import cached_property

import numpy as np

from prorsa_schemas import EngineDeregistered, EngineRegistered, EngineStats, EngineSwitched, Event
from prorsa_schemas.fold import Mutators
from prorsa_schemas.registry import EngineRegistry


DEPARTURES_KEPT = 256  # prefill departures kept per engine (and for the pool); more when it has more queues


class RankDepartures:
    """The last prefill departure on each (engine code, attention data-parallel rank),
    as one array so that a snapshot reads every in-flight request's in one lookup."""

    __slots__ = ("_ts",)

    def __init__(self) -> None:
        self._ts = np.full((0, 0), -np.inf)

    def get(self, code: int, rank: int) -> float:
        """When the last request left the rank (-inf: none since it registered)."""
        if 0 <= code < self._ts.shape[0] and 0 <= rank < self._ts.shape[1]:
            return float(self._ts[code, rank])
        return -np.inf

    def set(self, code: int, rank: int, ts: float) -> None:
        if code < 0 or rank < 0:
            return
        rows, cols = self._ts.shape
        if code >= rows or rank >= cols:
            grown = np.full((max(rows, code + 1), max(cols, rank + 1)), -np.inf)
            grown[:rows, :cols] = self._ts
            self._ts = grown
        self._ts[code, rank] = ts

    def forget(self, code: int) -> None:
        """A re-registered engine starts afresh."""
        if 0 <= code < self._ts.shape[0]:
            self._ts[code] = -np.inf

    def lookup(self, codes: np.ndarray, ranks: np.ndarray) -> np.ndarray:
        """:meth:`get` of each (code, rank) pair (-inf where either is unknown)."""
        out = np.full(len(codes), -np.inf)
        ok = (codes >= 0) & (codes < self._ts.shape[0]) & (ranks >= 0) & (ranks < self._ts.shape[1])
        out[ok] = self._ts[codes[ok], ranks[ok]]
        return out


class EngineFold:
    """Engine events and the prefill helpers of the fold (see LiveState).

    Engine roles come from the engine registry (:mod:`prorsa_schemas.registry`, the one
    fold of the engine events); ``_role`` is its engine -> role map as the snapshot reads
    it. On top of it: the data-parallel prefill queues of each engine (from its
    registration), the decode KV each decode engine reports, and the prefill departures
    a re-registered engine starts afresh with.
    """

    # Set by LiveState.__init__.
    n: int
    config: object
    started_at: np.ndarray
    engine: np.ndarray
    rank: np.ndarray
    _role: dict
    _servers: dict
    _departures: dict
    _rank_departures: RankDepartures
    _decode_kv: dict
    _engine_code: dict
    _engine_names: list
    history: object
    kv_now: float

    @cached_property
    def engine_registry(self) -> EngineRegistry:
        """The engines as their agents report them."""
        return EngineRegistry()

    def engine_roles(self) -> dict[str, str]:
        """Engine id -> role of every engine known."""
        return self.engine_registry.roles()

    def _engine_event(self, ev) -> None:
        """Apply ``ev`` to the registry and to the forecaster's engine state (``_mutate``)."""
        change = self.engine_registry.apply(ev)
        self.__dict__.pop("_pool_servers", None)  # roles or queues may have changed
        rec = change.record
        if rec is None:
            self._role.pop(ev.engine, None)
        else:
            self._role[ev.engine] = rec.role
        _mutate(self, ev)

    # -- what a snapshot reads --------------------------------------------------------------
    def prefill_instances(self) -> list[str | None]:
        """Prefill instances to simulate: the known prefill/mixed engines, else the
        engines seen serving prefills, else the pool (None). An engine switching away
        from prefill takes no new request from its ``engine.switching`` on (it drains):
        it is left out, unless every prefill engine is."""
        names = [n for n, r in self._role.items() if r in ("prefill", "mixed")]
        records = self.engine_registry.engines
        staying = [n for n in names if records[n].switching_to in (None, "prefill", "mixed")]
        names = staying or names
        if not names:
            names = [n for n, m in self.history.prefill.items() if m.n > 0]
        return sorted(names) if names else [None]

    def engine_index(self, names: list[str | None]) -> np.ndarray:
        """Engine code -> index in ``names`` (-1: not one of them); the last entry stands
        for the code -1 (no engine)."""
        lookup = np.full(len(self._engine_names) + 1, -1, dtype=np.int64)
        for k, name in enumerate(names):
            if name is not None and name in self._engine_code:
                lookup[self._engine_code[name]] = k
        return lookup

    def decode_kv(self) -> float:
        """K^D: the decode engines' KV in use (engine.stats), else the prompts decoding."""
        if self._decode_kv:
            return float(sum(self._decode_kv.values()))
        return max(float(self.kv_now), 0.0)

    # -- prefill helpers ------------------------------------------------------------------
    def _prefill_progress(self, ts: float, queued: float | None = None, service: float = 0.0) -> None:
        """The first prefill progress after a weight update ends its pause: a prefill that
        starts, or one that finishes of a request queued at or after the update, less
        ``service``, its own prefill time (:meth:`_finish_service`): the engines resumed
        that long before it finished, at the latest. A request queued before the update
        may have been in prefill when ``policy.updated`` was published and finish before
        the engines pause (a framework that publishes the update, then pauses them),
        which says nothing of when they resume."""
        if self._pause_pending and (queued is None or queued >= self.last_update_ts):
            self._pause_pending = False
            self.resumed_ts = max(ts - service, self.last_update_ts)
            self.history.update_pause.observe(self.resumed_ts - self.last_update_ts)

    def _finish_service(self, i: int, cached_tokens: int | None) -> float:
        """Slot ``i``'s prefill time as its instance's learnt model gives it (its prompt, with
        the ``cached_tokens`` its finish reports, or none: an update flushes the caches),
        where its finish would end a weight update's pause: the log has no
        ``prefill.started`` for it (a start would have ended the pause first), so the
        pause is its finish less this. Taken whole, the pause would hold the first
        re-queued request's own prefill, and the queue model, which starts every server
        at the pause's end and then serves, would count it twice (the demo's log: the
        first prefill after each update finishes 1.9-2.0 s after it, 1.0 s of it the
        weight sync)."""
        if not self._pause_pending or not self.queued_at[i] >= self.last_update_ts:
            return 0.0
        c = int(self.engine[i])
        x = float(self.prompt[i])
        cached = 0.0 if cached_tokens is None else min(float(cached_tokens), x)
        g = self.history.prefill_model(self._engine_names[c] if c >= 0 else None).g(np.array([x]), cached)
        return float(np.nan_to_num(g[0], nan=0.0, posinf=0.0))

    def expected_cached(self, prompt, cache_prompt, warm):
        """Expected cached prefix of a prompt: the learnt share of the trajectory's
        cached previous prompt (warm), else the learnt share of the prompt (cold)."""
        h = self.history
        prompt = np.asarray(prompt, dtype=float)
        c = np.where(warm, h.cache_warm.value * np.minimum(cache_prompt, prompt), h.cache_cold.value * prompt)
        return np.clip(c, 0.0, np.maximum(prompt - 1.0, 0.0))

    def in_flight_begins(self, mask: np.ndarray) -> np.ndarray:
        """When each slot of ``mask`` (requests in prefill) began to hold its queue: its
        ``prefill.started``, or on a named rank the later of that and the rank's last
        departure, the start that service times are learnt from (:meth:`_learn_prefill`):
        chunked prefill starts a request in the chunk that ends the one before it."""
        n = self.n
        started = self.started_at[:n][mask].copy()
        if self.config.use_dp_rank and len(started):
            dep = self._rank_departures.lookup(self.engine[:n][mask], self.rank[:n][mask])
            started = np.where(dep > started, dep, started)  # NaN (no prefill.started) stays NaN
        return started

    def servers(self, engine: str | None) -> int:
        """Data-parallel prefill queues of an engine (1 when unknown). ``None`` is the pool
        that serves the requests whose engine the log does not name: every queue of the
        prefill (and mixed) engines known, 1 when none is."""
        if engine is not None:
            return self._servers.get(engine, 1)
        return self._pool_servers

    @cached_property
    def _pool_servers(self) -> int:
        """The pool's queues (``servers(None)``), recomputed after an engine event."""
        pool = sum(self._servers.get(e, 1) for e, r in self._role.items() if r in ("prefill", "mixed"))
        return max(pool, 1)

    def _learn_prefill(self, i: int, ts: float, cached_tokens: int | None) -> None:
        """Slot ``i``'s prefill finished at ``ts``: learn the prefix-cache hit rates and
        the instance's prefill time, and remember the prompt its instance now caches."""
        c = int(self.engine[i])
        name = self._engine_names[c] if c >= 0 else None
        h = self.history
        x = self.prompt[i]
        warm = self.cache_ts[i] > self.last_flush_ts  # False when NaN (nothing cached)
        held = int(self.cache_engine[i])
        if cached_tokens is not None:
            cached = float(min(cached_tokens, x))
            if warm and c >= 0 and held >= 0:
                # Both engines known: a prefix cache lives on one engine, so the request
                # finds it only if the router sent it back there (cache-aware routing
                # does, unless that engine's queue is too long).
                same = c == held
                h.cache_same_size.observe(min(self.cache_prompt[i], x), float(same), 1.0)
                if same:
                    h.cache_warm_age.observe(ts - self.last_flush_ts, cached, min(self.cache_prompt[i], x))
                else:
                    h.cache_cold.observe(cached, x)
            elif warm:
                h.cache_warm_age.observe(ts - self.last_flush_ts, cached, min(self.cache_prompt[i], x))
            else:
                h.cache_cold.observe(cached, x)
        else:
            cached = float(self.expected_cached(x, self.cache_prompt[i], warm))
        # Prefill time: from prefill.started when observed, else departure-based: with c
        # data-parallel queues behind the engine a FIFO request starts at the later of its
        # arrival and the c-th previous departure. A prefill that spans a weight update
        # was restarted (and paused): it says nothing about the engine's speed.
        # The pool's queues change with every switch: enough departures are kept for
        # any size it takes.
        servers = self.servers(name)
        deps = self._departures.get(name)
        if deps is None or deps.maxlen < servers:
            deps = self._departures[name] = deque(deps or (), maxlen=max(servers, DEPARTURES_KEPT))
        if np.isnan(self.started_at[i]):
            # A request queued before the engines resumed from a weight sync began at the
            # earliest then: its wait through the pause is not prefill time.
            last = deps[-servers] if len(deps) >= servers else -np.inf
            begin = max(self.queued_at[i], last, self.resumed_ts)
        else:
            begin = self.started_at[i]
        rank = int(self.rank[i]) if self.config.use_dp_rank else -1
        if rank >= 0 and c >= 0:
            # The rank is known (request.queued.dp_rank): the queue model's service time
            # is how long the request held its rank's queue, from the later of its start
            # and the previous departure on that rank. Chunked prefill packs the head of
            # the next request into the chunk that ends the previous one, so from
            # prefill.started alone consecutive requests overlap and their times add up
            # to more than the rank spent on them. (A request in flight is timed the same
            # way: :meth:`in_flight_begins`.)
            begin = max(begin, self._rank_departures.get(c, rank))
            self._rank_departures.set(c, rank, ts)
        if begin >= self.last_update_ts:
            h.prefill_model(name).observe(x, ts - begin, cached)
        deps.append(ts)
        self.cache_prompt[i] = x
        self.cache_ts[i] = ts
        self.cache_engine[i] = c


# What each engine event means for the forecaster beyond the registry's roles.
_mutate: Mutators[Callable[[EngineFold, Event], None]] = Mutators()


@_mutate.on("engine.registered")
def _registered(fold, ev: EngineRegistered) -> None:
    fold._code(ev.engine)
    par = ev.parallel
    # Attention data-parallel ranks each run their own prefill queue.
    servers = (par.attn_dp or par.dp or 1) if par is not None else 1
    fold._servers[ev.engine] = int(servers)
    fold._departures.pop(ev.engine, None)
    fold._rank_departures.forget(fold._code(ev.engine))


@_mutate.on("engine.stats")
def _stats(fold, ev: EngineStats) -> None:
    fold._code(ev.engine)
    if ev.role == "decode":
        fold._decode_kv[ev.engine] = ev.kv_used_tokens
    else:
        fold._decode_kv.pop(ev.engine, None)


@_mutate.on("engine.switched")
def _switched(fold, ev: EngineSwitched) -> None:
    if ev.to_role != "decode":
        fold._decode_kv.pop(ev.engine, None)


@_mutate.on("engine.deregistered")
def _deregistered(fold, ev: EngineDeregistered) -> None:
    fold._decode_kv.pop(ev.engine, None)
