"""Where a forecaster's error comes from, on one contract log (the figures behind the
analysis in docs/forecaster.md).

    .venv/bin/python benchmarks/forecast_diagnostics.py LOG [--horizon 10] [--revealed] [--queue] [-o KEY=VALUE ...]

Prints:

* prefix cache by engine: of the warm requests (the trajectory's previous prompt cached,
  no weight update since), the share routed back to the engine that cached it (overall
  and by the log2 bin of the prefix's size), and the hit rate (cached_tokens > 0) of
  those routed back and of the others;
* tool-return calibration: for trajectories in Tool at a window's start, the mean
  predicted probability of returning within the window against the observed share, by
  elapsed time in the tool;
* (the decode admissions split into requests known at t and arrivals is in
  ``prorsa forecast-eval``'s report: ``decode.components``);
* the admitted share of arrivals: of each window's prefill arrivals, the share (in
  tokens) prefilled before the window ends, forecast against actual, and the decode
  error on arrivals if the arrivals or the share were exact;
* with ``--revealed`` (a second replay): the decode forecast of the requests known at
  t (queued or in prefill), as made and with each one's cache outcome revealed (the
  ``cached_tokens`` its ``prefill.finished`` will report), to tell the cache's coin flips
  from the queue model's placement;
* with ``--queue`` (a second replay): the queue model's timing of the requests known at
  t on a named rank (``request.queued.dp_rank``), against the log: when each queued one
  starts to hold its rank (the later of its ``prefill.started`` and the rank's previous
  departure, as service times are learnt) and how long it holds it, overall and by
  prompt size; and when each one in prefill at t finishes;
* the prefill engines' balance: from ``engine.stats`` (``--with-engines`` exports), by
  window, each prefill engine's requests (running + queued), where the pool holds at least
  8: the busiest engine over the mean and the coefficient of variation, averaged (a
  cache-aware router keeps conversations on their prefix's engine and the queues come
  apart; the queue model drains the pool as one line);
* residuals of both series: signed bias (share of the actual demand) and lag-1
  autocorrelation (near 0: white, nothing slow left for a correction to learn);
* after weight updates (a log with ``policy.updated``): the hit ratio (cached over
  cacheable tokens) of the warm requests routed back to their caching engine, by seconds
  since the update (the caches refill after the flush), and the decode forecast's error
  by the window's place relative to the last update (-1: the window it lands in), and the
  weight-sync pause learnt at each update beside when the first prefill of a request
  queued after it ended (docs/forecaster.md, "The weight-sync pause").
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import replace

import numpy as np

from prorsa_forecaster.config import ForecastConfig
from prorsa_forecaster.snapshot import size_bin
from prorsa_forecaster.terms.known_queue import known_queue
from prorsa_forecaster.trajstate import PREFILL, QUEUED, TOOL
from prorsa_forecaster.windows import WindowLoop
from prorsa_schemas import read_log


AGE_EDGES = np.array([0, 10, 20, 30, 40, 60, 90, 120, 150, np.inf])


def cache_by_engine(path: str) -> list[float]:
    """Prints the prefix cache by engine; returns the log's weight-update times."""
    held: dict[str, tuple[str, int]] = {}  # traj -> (engine caching its previous prompt, its tokens)
    queued: dict[str, tuple[str, str | None, int]] = {}  # traj -> (req, engine queued at, prompt)
    same = hits_same = hits_other = other = 0
    by_size: dict[int, list[int]] = {}  # log2 bin of the prefix -> [warm requests, routed back]
    by_age = np.zeros((len(AGE_EDGES) - 1, 3))  # seconds since the update -> [requests, cached, cacheable]
    last_update = None
    updates: list[float] = []
    for line in read_log(path):
        ev = line.event
        if ev is None:
            continue
        if ev.type == "policy.updated":
            held.clear()  # a weight update flushes every prefix cache
            last_update = ev.ts
            updates.append(ev.ts)
        elif ev.type == "request.queued":
            queued[ev.traj] = (ev.req, ev.engine, ev.prompt_tokens)
        elif ev.type == "prefill.finished" and ev.traj in queued and queued[ev.traj][0] == ev.req:
            _, engine, prompt = queued.pop(ev.traj)
            engine = engine or ev.engine
            prev = held.get(ev.traj)
            if prev is not None and engine is not None and ev.cached_tokens is not None:
                hit = ev.cached_tokens > 0
                row = by_size.setdefault(int(size_bin(min(prev[1], prompt))), [0, 0])
                row[0] += 1
                if engine == prev[0]:
                    same += 1
                    hits_same += hit
                    row[1] += 1
                    if last_update is not None:
                        k = int(np.searchsorted(AGE_EDGES, ev.ts - last_update, side="right")) - 1
                        by_age[k] += (1, min(ev.cached_tokens, prev[1], prompt), min(prev[1], prompt))
                else:
                    other += 1
                    hits_other += hit
            if ev.engine is not None:
                held[ev.traj] = (ev.engine, prompt)
    n = same + other
    if n == 0:
        print("prefix cache by engine: no warm request with engines and cached_tokens in the log")
        return updates
    print(f"prefix cache by engine: {n} warm requests, {same / n:.1%} routed back to the caching engine; "
          f"hit rate routed back {hits_same / max(same, 1):.1%}, elsewhere {hits_other / max(other, 1):.1%}")
    print("  routed back by prefix size (the trajectory's previous prompt):")
    for b, (nb, sb) in sorted(by_size.items()):
        print(f"    [{2**b:>7d}, {2 ** (b + 1):>7d}) tokens: n={nb:6d} routed back {sb / nb:.1%}")
    if by_age[:, 0].any():
        print("  routed back, by seconds since the last weight update: cached / cacheable tokens")
        for lo, hi, (nr, c, cp) in zip(AGE_EDGES[:-1], AGE_EDGES[1:], by_age):
            if nr:
                print(f"    [{lo:g}, {hi:g}) s: n={int(nr):6d} hit ratio {c / cp:.3f}")
    return updates


def prefill_balance(path: str, horizon: float) -> None:
    """The prefill engines' load balance by window, from their ``engine.stats``."""
    by_window: dict[int, dict[str, int]] = {}
    t0 = None
    for line in read_log(path):
        ev = line.event
        if ev is None or ev.type != "engine.stats" or ev.role != "prefill":
            continue
        t0 = ev.ts if t0 is None else t0
        by_window.setdefault(int((ev.ts - t0) // horizon), {})[ev.engine] = ev.running_reqs + ev.queued_reqs
    rows = [np.array(list(d.values()), float) for _, d in sorted(by_window.items())]
    rows = [v for v in rows if len(v) >= 2 and v.sum() >= 8]
    if not rows:
        print("prefill balance: no window with two or more prefill engines holding 8 or more requests "
              "(engine.stats: export with --with-engines)")
        return
    peak = np.mean([v.max() / v.mean() for v in rows])
    cv = np.mean([v.std() / v.mean() for v in rows])
    print(f"prefill balance: {len(rows)} windows; busiest prefill engine {peak:.2f}x the mean, "
          f"coefficient of variation {cv:.2f}")


def after_updates(update_ts: list[float], results) -> None:
    """The decode forecast's error by the window's place relative to the last weight
    update before its end (-1: the update lands in it; 0: the window after; ...)."""
    updates = np.array(update_ts)
    if not len(updates) or not results:
        return
    rows: dict[int, list[float]] = {}
    total = sum(abs(r.forecast.decode_admit_tokens - r.decode_actual) for r in results)
    for r in results:
        before = updates[updates < r.t + r.horizon]
        if not len(before):
            continue
        k = min(int(np.floor((r.t - before[-1]) / r.horizon)), 12)
        row = rows.setdefault(k, [0, 0.0, 0.0, 0.0])
        e = r.forecast.decode_admit_tokens - r.decode_actual
        row[0] += 1
        row[1] += abs(e)
        row[2] += e
        row[3] += r.decode_actual
    print("decode error by window after the last weight update (-1: the update lands in it; 12: 12 or more):")
    for k, (n, ae, se, act) in sorted(rows.items()):
        # (no admission in those windows: WAPE has no denominator there)
        wape = f"WAPE {ae / act:.1%} signed {se / act:+.1%}" if act > 0 else f"no admissions, {ae / 1e6:.2f}M forecast"
        share = f"{ae / total:.1%}" if total > 0 else "-"
        print(f"  {k:3d}: n={n:4d} {wape} share of all error {share}")
    # The first updates' landing windows apart: before the first update the forecaster has
    # no trigger -> policy.updated delay to go by, so the first one lands unforecast.
    # Last value's miss in the same window (the window before's actual) beside it.
    parts = []
    for i, u in enumerate(updates[:3]):
        at = [j for j, r in enumerate(results) if r.t <= u < r.t + r.horizon]
        ae = sum(abs(results[j].forecast.decode_admit_tokens - results[j].decode_actual) for j in at)
        lv = sum(abs((results[j - 1].decode_actual if j else 0.0) - results[j].decode_actual) for j in at)
        into = f", {u - results[at[0]].t:.2f} s into its window" if at else ""
        parts.append(f"update {i + 1} (t={u:.0f} s{into}) {ae / total:.1%} ({ae / 1e6:.2f}M tokens off; last value "
                     f"{lv / 1e6:.2f}M)" if total > 0 else f"update {i + 1} -")
    print("  share of all decode error in the window each of the first updates lands in: " + ", ".join(parts))


class _Probe(WindowLoop):
    """The window loop, noting at each window's start what the diagnostics need."""

    def __init__(self, cfg: ForecastConfig) -> None:
        super().__init__(cfg)
        self.tool_rows: dict[tuple[int, float], list[float]] = {}  # (slot, t) -> [elapsed, q, returned]

    def _open(self) -> None:
        super()._open()
        st, t, cfg = self.state, self.window_start, self.config
        n = st.n
        tool = np.flatnonzero(st.state[:n] == TOOL)
        if len(tool):
            e = t - st.entered[:n][tool]
            q = st.history.tool.bucket_table(e, cfg.horizon, cfg.steps).sum(axis=1)
            for i, ee, qq in zip(tool.tolist(), e.tolist(), q.tolist()):
                self.tool_rows[(i, t)] = [ee, qq, 0.0]


class _Revealed(WindowLoop):
    """The window loop with each known request's cache outcome revealed at t: a queued or
    in-flight request's cached prefix is set to the ``cached_tokens`` its
    ``prefill.finished`` will report, and it hits with certainty (predicted arrivals keep
    their probabilities). What the decode forecast of the known requests would be worth
    if the router's choice of rank inside an engine (not in the contract) were known."""

    def __init__(self, cfg: ForecastConfig, cached: dict[str, int]) -> None:
        super().__init__(cfg)
        self.cached = cached

    def _snapshot(self, t: float):
        st = self.state
        n = st.n
        snap = st.snapshot(t)
        reqs = np.array([st.request_of(i) for i in range(n)], dtype=object)

        def revealed(mask, old):
            got = np.array([self.cached.get(r, np.nan) for r in reqs[mask]], dtype=float)
            return np.where(np.isnan(got), old, got)

        ready, inflight = st.state[:n] == QUEUED, st.state[:n] == PREFILL
        return replace(
            snap,
            ready_cached=revealed(ready, snap.column("ready_cached", "ready_prompt")),
            inflight_cached=revealed(inflight, snap.column("inflight_cached", "inflight_prompt")),
            ready_unrouted=np.zeros(int(ready.sum())),
            inflight_unrouted=np.zeros(int(inflight.sum())),
            cache_hit=1.0,
            # Predicted arrivals hit with cache_hit x their bin's share: unchanged.
            cache_same_table=np.asarray(snap.cache_same_table) * snap.cache_hit,
        )


def known_revealed(path: str, results, horizon: float) -> None:
    """Decode WAPE of the known requests' part, as forecast and with each known request's
    cache outcome revealed (see :class:`_Revealed`)."""
    cached = {}
    for line in read_log(path):
        ev = line.event
        if ev is not None and ev.type == "prefill.finished" and ev.cached_tokens is not None:
            cached[ev.req] = ev.cached_tokens
    loop = _Revealed(ForecastConfig(horizon=horizon, **_OPTS), cached)
    revealed = []
    for line in read_log(path):
        if line.event is not None:
            revealed.extend(loop.feed(line.event))
    act = np.array([r.decode_known for r in results])
    if act.sum() <= 0:
        return
    base = np.array([r.forecast.raw_decode_known for r in results])
    rev = np.array([r.forecast.raw_decode_known for r in revealed[: len(results)]])
    tot = act.sum()
    print(f"decode admissions of known requests (before the decode correction): WAPE {np.abs(base - act).sum() / tot:.1%} "
          f"(signed {(base - act).sum() / tot:+.1%}), with each one's cache outcome revealed "
          f"{np.abs(rev - act).sum() / tot:.1%} (signed {(rev - act).sum() / tot:+.1%}; {len(results)} windows)")


class _Queue(WindowLoop):
    """The window loop, keeping at each window's start the queue model's expected start
    and service of each known request queued on a named rank, and the expected finish of
    each one in prefill (seconds after t)."""

    def __init__(self, cfg: ForecastConfig) -> None:
        super().__init__(cfg)
        self.queued: list[tuple[np.ndarray, ...]] = []  # (reqs, prompt, start, service)
        self.inflight: list[tuple[np.ndarray, ...]] = []  # (reqs, t, finish)

    def _snapshot(self, t: float):
        snap = super()._snapshot(t)
        st = self.state
        n = st.n
        kq = known_queue(snap)
        reqs = np.array([st.request_of(i) for i in range(n)], dtype=object)
        ready = reqs[st.state[:n] == QUEUED]
        ranked = np.asarray(snap.ready_rank)
        if len(ranked) == len(ready) and len(ready):
            m = ranked >= 0
            self.queued.append((ready[m], kq.x_rd[m], kq.s_rd[m] + t, kq.svc_rd[m]))
        inflight = reqs[st.state[:n] == PREFILL]
        if len(inflight) == len(kq.x_in) and len(inflight):
            finish = kq.started + kq.p_in * kq.gh_in + (1.0 - kq.p_in) * kq.gm_in
            self.inflight.append((inflight, np.full(len(inflight), t), np.maximum(finish, 0.0) + t))
        return snap


def queue_timing(path: str, horizon: float) -> None:
    """The queue model's timing of the known requests against the log (see :class:`_Queue`)."""
    begin, finish, rank_of, started, last = {}, {}, {}, {}, {}
    for line in read_log(path):
        ev = line.event
        if ev is None:
            continue
        if ev.type == "request.queued":
            rank_of[ev.req] = (ev.engine, ev.dp_rank) if ev.engine is not None and ev.dp_rank is not None else None
        elif ev.type == "prefill.started":
            started[ev.req] = ev.ts
        elif ev.type == "prefill.finished":
            key = rank_of.get(ev.req)
            finish[ev.req] = ev.ts
            if key is not None and ev.req in started:
                begin[ev.req] = max(started[ev.req], last.get(key, -np.inf))
                last[key] = ev.ts
    loop = _Queue(ForecastConfig(horizon=horizon, **_OPTS))
    for line in read_log(path):
        if line.event is not None:
            loop.feed(line.event)

    def actual(table, reqs):
        return np.fromiter((table.get(r, np.nan) for r in reqs), float, len(reqs))

    if loop.queued:
        reqs = np.concatenate([q[0] for q in loop.queued])
        x, s, g = (np.concatenate([q[k] for q in loop.queued]) for k in (1, 2, 3))
        b, f = actual(begin, reqs), actual(finish, reqs)
        ok = np.isfinite(b) & np.isfinite(f)
        x, s, g, b, f = x[ok], s[ok], g[ok], b[ok], f[ok]
        svc = f - b
        if len(x):
            print(f"known requests queued on a named rank at a window's start ({len(x)} request-windows): "
                  f"start {np.mean(b - s):+.2f} s after the queue model's on average; service {svc.mean():.2f} s "
                  f"against {g.mean():.2f} s forecast ({svc.sum() / g.sum():.3f}x)")
            edges = np.quantile(x, [0.0, 0.25, 0.5, 0.75, 1.0])
            for k, (lo, hi) in enumerate(zip(edges[:-1], edges[1:])):
                m = (x >= lo) & ((x < hi) if k < 3 else (x <= hi))
                if m.any():
                    print(f"  prompt [{lo:,.0f}, {hi:,.0f}] tokens: service {svc[m].mean():.2f} s against "
                          f"{g[m].mean():.2f} s ({svc[m].sum() / g[m].sum():.3f}x)")
    if loop.inflight:
        reqs = np.concatenate([q[0] for q in loop.inflight])
        t, pf = (np.concatenate([q[k] for q in loop.inflight]) for k in (1, 2))
        f = actual(finish, reqs)
        ok = np.isfinite(f)
        if ok.any():
            print(f"known requests in prefill at a window's start ({int(ok.sum())} request-windows): finish "
                  f"{np.mean(f[ok] - t[ok]):.2f} s after t against {np.mean(pf[ok] - t[ok]):.2f} s forecast")


def admitted_share(results) -> None:
    """Of the prefill arrivals of each window, the share admitted to decode in the same
    window (token-weighted), forecast (the queue model on the predicted arrivals) against
    actual; and the decode error on arrivals if either factor were exact."""
    fa = np.array([r.forecast.predicted_prefill for r in results])
    aa = np.array([r.prefill_actual - r.backlog for r in results])
    fd = np.array([r.forecast.raw_decode - r.forecast.raw_decode_known for r in results])
    ad = np.array([r.decode_actual - r.decode_known for r in results])
    m = (fa > 0) & (aa > 0)
    if not m.any() or ad[m].sum() <= 0:
        return
    sf, sa = fd[m] / fa[m], ad[m] / aa[m]
    total = ad[m].sum()
    print(f"decode admissions of arrivals (before the decode correction, after the admitted-share one): admitted share of the arrivals forecast "
          f"{fd[m].sum() / fa[m].sum():.3f}, actual {ad[m].sum() / aa[m].sum():.3f} ({int(m.sum())} windows); "
          f"WAPE {np.abs(fd[m] - ad[m]).sum() / total:.1%}, "
          f"with the actual arrivals {np.abs(sf * aa[m] - ad[m]).sum() / total:.1%}, "
          f"with the actual share {np.abs(sa * fa[m] - ad[m]).sum() / total:.1%}")


_OPTS: dict = {}  # ForecastConfig overrides (-o KEY=VALUE), for every replay


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log")
    ap.add_argument("--horizon", type=float, default=10.0)
    ap.add_argument("--revealed", action="store_true", help="also replay with the known requests' cache outcomes revealed (a second replay)")
    ap.add_argument("--queue", action="store_true", help="also replay to time the queue model's known requests against the log (a second replay)")
    ap.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE",
                    help="a ForecastConfig field, as `prorsa forecast-eval -o` takes it (e.g. cache_age_pseudo=inf)")
    args = ap.parse_args()
    if not os.path.isfile(args.log):
        ap.error(f"no such log file: {args.log}")
    if not (math.isfinite(args.horizon) and args.horizon > 0):
        ap.error("--horizon must be a finite number > 0")
    if args.option:
        import typer

        from prorsa_forecaster.cli import parse_options

        try:
            _OPTS.update(parse_options(args.option))  # prints the reason of a bad one
        except typer.Exit as exc:
            sys.exit(exc.exit_code)
        try:
            ForecastConfig(horizon=args.horizon, **_OPTS)  # a bad value, before minutes of replay
        except ValueError as exc:
            ap.error(f"-o: {exc}")
    update_ts = cache_by_engine(args.log)
    prefill_balance(args.log, args.horizon)

    loop = _Probe(ForecastConfig(horizon=args.horizon, **_OPTS))
    results = []
    pauses: list[tuple[float, float | None]] = []  # (pause learnt, first prefill end after the update)
    update_at, first_end = None, None
    for line in read_log(args.log):
        ev = line.event
        if ev is None:
            continue
        if ev.type == "policy.updated":
            update_at, first_end = ev.ts, None
        elif ev.type == "prefill.finished" and update_at is not None and first_end is None:
            i = loop.state.slot_of(ev)
            if i is not None and loop.state.queued_at[i] >= update_at:
                first_end = ev.ts - update_at
        learnt = loop.state.history.update_pause.n
        results.extend(loop.feed(ev))
        if loop.state.history.update_pause.n > learnt:
            pauses.append((loop.state.resumed_ts - loop.state.last_update_ts, first_end))
        if loop.window_start is not None and ev.type == "request.queued":
            row = loop.tool_rows.get((loop.state.slot_of(ev), loop.window_start))
            if row is not None:
                row[2] = 1.0
    # The window the log ends in is cut short (forecast-eval leaves it out too).

    rows = np.array(list(loop.tool_rows.values())) if loop.tool_rows else np.zeros((0, 3))
    if len(rows):
        print(f"tool returns: mean predicted {rows[:, 1].mean():.3f}, observed {rows[:, 2].mean():.3f} "
              f"({len(rows)} trajectory-windows in Tool)")
        edges = (0, 1, 2, 4, 8, 16, 32, 64, np.inf)
        for lo, hi in zip(edges[:-1], edges[1:]):
            m = (rows[:, 0] >= lo) & (rows[:, 0] < hi)
            if m.any():
                print(f"  elapsed [{lo:g}, {hi:g}) s: n={int(m.sum()):6d} predicted {rows[m, 1].mean():.3f} "
                      f"observed {rows[m, 2].mean():.3f}")

    admitted_share(results)
    after_updates(update_ts, results)
    if pauses:
        print("weight-sync pause learnt at each update (s; in brackets when the first prefill of a request queued "
              "after it ended): " + ", ".join(f"{p:.2f}" + ("" if e is None else f" ({e:.2f})") for p, e in pauses))
    if args.revealed:
        known_revealed(args.log, results, args.horizon)
    if args.queue:
        queue_timing(args.log, args.horizon)

    for name, f_of, a_of in (
        ("prefill", lambda r: r.forecast.prefill_tokens, lambda r: r.prefill_actual),
        ("decode", lambda r: r.forecast.decode_admit_tokens, lambda r: r.decode_actual),
    ):
        f = np.array([f_of(r) for r in results])
        a = np.array([a_of(r) for r in results])
        if len(a) > 2 and a.sum() > 0:
            e = f - a
            ac = float(np.corrcoef(e[:-1], e[1:])[0, 1]) if e.std() > 0 else float("nan")
            print(f"{name} residuals: WAPE {np.abs(e).sum() / a.sum():.2%}, signed {e.sum() / a.sum():+.2%}, "
                  f"lag-1 autocorrelation {ac:+.2f} ({len(a)} windows)")


if __name__ == "__main__":
    main()
