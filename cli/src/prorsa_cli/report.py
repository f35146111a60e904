"""The end of a live run: read the durable log and the services' metrics, summarise, plot.

Everything here reads what a user could read: the tracker's SQL log (the ``events`` table
holds every valid event's exact bytes) and the forecaster's Prometheus endpoint.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import httpx


def load_events(db_url: str) -> list[dict]:
    """Every event in the tracker's log, in stream order, as JSON objects."""
    from sqlalchemy import select

    from prorsa_tracker.db import make_engine
    from prorsa_tracker.models import EventRow

    eng = make_engine(db_url)
    try:
        with eng.connect() as conn:
            rows = conn.execute(select(EventRow.raw).order_by(EventRow.pos)).scalars().all()
    finally:
        eng.dispose()
    return [json.loads(r) for r in rows]


def count_run(db_url: str, run: str) -> tuple[int, int]:
    """(rollout events stored for ``run``, anomalies recorded for ``run``) in the tracker's log."""
    from sqlalchemy import func, inspect, select

    from prorsa_schemas.events import ROLLOUT_TYPES
    from prorsa_tracker.db import make_engine
    from prorsa_tracker.models import AnomalyRow, EventRow

    eng = make_engine(db_url)
    try:
        if not inspect(eng).has_table("events"):
            return 0, 0
        with eng.connect() as conn:
            # Rollout events only: the forecaster and allocator label their output with the run too.
            n = conn.execute(select(func.count()).select_from(EventRow).where(
                EventRow.run == run, EventRow.type.in_(sorted(ROLLOUT_TYPES)))).scalar_one()
            a = conn.execute(select(func.count()).select_from(AnomalyRow).where(AnomalyRow.run == run)).scalar_one()
    finally:
        eng.dispose()
    return int(n), int(a)


def scrape(url: str) -> dict[str, float]:
    """A Prometheus text page as {'name{labels}': value} (empty if unreachable or not a
    Prometheus page), read with prometheus-client's parser; labels as the page writes them
    (``prorsa_forecaster_wape{series="prefill"}``)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = httpx.get(url.rstrip("/") + "/metrics", timeout=2.0).text
    except httpx.HTTPError:
        return {}
    out: dict[str, float] = {}
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in s.labels.items())
                out[s.name + (f"{{{labels}}}" if labels else "")] = float(s.value)
    except ValueError:  # not the Prometheus text format: nothing to read
        return {}
    return out


def summarise(events: list[dict], run: str, driver: dict | None, forecaster_metrics: dict[str, float],
              horizon: float) -> dict:
    """The summary shown at the end of a live run (also written as summary.json)."""
    from prorsa_schemas.events import ROLLOUT_TYPES

    by_type: dict[str, int] = defaultdict(int)
    for e in events:
        by_type[e["type"]] += 1
    fc = [e for e in events if e["type"] == "forecast.window"]
    wape = {s: forecaster_metrics.get(f'prorsa_forecaster_wape{{series="{s}"}}') for s in ("prefill", "decode")}
    wape = {k: (None if v is None or math.isnan(v) else round(v, 4)) for k, v in wape.items()}
    speed = (driver or {}).get("speed", 1.0)
    # Mean trajectory completion time (the paper's Table 2 measure): dispatch to reward.
    began: dict[str, float] = {}
    spans: list[float] = []
    for e in events:
        if e.get("run") != run:
            continue
        if e["type"] == "trajectory.dispatched":
            began[e["traj"]] = e["ts"]
        elif e["type"] == "reward.finished" and e["traj"] in began:
            spans.append(e["ts"] - began.pop(e["traj"]))
    return {
        "trajectory_mean_s": round(sum(spans) / len(spans), 3) if spans else None,
        "run": run,
        "rollout_step_times_s": (driver or {}).get("step_times_s", []),
        "rollout_step_times_simulated_s": [round(t * speed, 1) for t in (driver or {}).get("step_times_s", [])],
        "trajectories": (driver or {}).get("completed"),
        "sampler": {"mode": (driver or {}).get("mode", "sync"), "staleness": (driver or {}).get("staleness", 0)},
        "dropped": (driver or {}).get("dropped", {}),
        "weight_syncs": {"syncs": (driver or {}).get("weight_syncs", 0),
                         "engine_pauses": (driver or {}).get("paused_engines", 0),
                         "pause_mode": (driver or {}).get("pause_mode", "abort")},
        "driver_events": (driver or {}).get("events"),
        "run_events_in_log": sum(1 for e in events if e.get("run") == run and e["type"] in ROLLOUT_TYPES),
        "commands": by_type.get("engine.command", 0),
        "switches": by_type.get("engine.switched", 0),
        "switch_failures": by_type.get("engine.switch_failed", 0),
        "plans": by_type.get("allocation.plan", 0),
        # What the plans asked for: under --policy advise nothing of it is commanded.
        "planned_switches": sum(len(e.get("switches") or []) for e in events if e["type"] == "allocation.plan"),
        "plans_with_switches": sum(1 for e in events if e["type"] == "allocation.plan" and e.get("switches")),
        # Each plan advises from the cluster as it is, so a move not commanded is named
        # again by the next plan: how many different (engine, role) moves they named.
        "distinct_planned_switches": len({(sw.get("engine"), sw.get("to_role")) for e in events
                                          if e["type"] == "allocation.plan" for sw in e.get("switches") or []}),
        "forecast_windows": len(fc),
        "horizon_s": horizon,
        "forecast_wape": wape,
    }


def timeline(events: list[dict], run: str, horizon: float, path: Path, title: str) -> Path | None:
    """PNG: prefill demand vs forecast, decode admissions vs forecast, engines per role."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rollout = [e for e in events if e.get("run") == run]
    if not rollout:
        return None
    t0 = min(e["ts"] for e in rollout)
    t0 = math.floor(t0 / horizon) * horizon
    demand: dict[int, float] = defaultdict(float)
    admit: dict[int, float] = defaultdict(float)
    prompt_of: dict[str, int] = {}
    for e in rollout:
        w = int((e["ts"] - t0) // horizon)
        if e["type"] == "request.queued":
            demand[w] += e["prompt_tokens"]
            prompt_of[e["req"]] = e["prompt_tokens"]
        elif e["type"] == "prefill.finished":
            admit[w] += prompt_of.get(e["req"], 0)
    fc = sorted((e for e in events if e["type"] == "forecast.window"), key=lambda e: e["t"])
    roles: dict[str, str] = {}
    steps: list[tuple[float, int, int]] = []
    for e in sorted((e for e in events if e["type"] in ("engine.registered", "engine.switched")), key=lambda e: e["ts"]):
        roles[e["engine"]] = e["role"] if e["type"] == "engine.registered" else e["to_role"]
        steps.append((e["ts"] - t0, sum(r == "prefill" for r in roles.values()), sum(r == "decode" for r in roles.values())))
    n = max([*demand, *admit, 0]) + 1
    xs = [i * horizon for i in range(n)]
    fig, ax = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    ax[0].bar(xs, [demand.get(i, 0) for i in range(n)], width=horizon * 0.9, align="edge", alpha=0.5,
              label="prefill arrivals (queued prompt tokens)")
    ax[0].step([e["t"] - t0 for e in fc], [e["prefill_tokens"] for e in fc], where="post", color="C3",
               label="forecast Ŵᴾ (incl. backlog)")
    ax[0].set_ylabel("tokens / window")
    ax[0].legend(loc="upper right", fontsize=8)
    ax[1].bar(xs, [admit.get(i, 0) for i in range(n)], width=horizon * 0.9, align="edge", alpha=0.5, color="C2",
              label="decode admissions (actual)")
    ax[1].step([e["t"] - t0 for e in fc], [e["decode_admit_tokens"] for e in fc], where="post", color="C3",
               label="forecast Âᴰ")
    ax[1].set_ylabel("tokens / window")
    ax[1].legend(loc="upper right", fontsize=8)
    if steps:
        ts = [s[0] for s in steps] + [n * horizon]
        ax[2].step(ts, [s[1] for s in steps] + [steps[-1][1]], where="post", label="prefill engines")
        ax[2].step(ts, [s[2] for s in steps] + [steps[-1][2]], where="post", label="decode engines")
        ax[2].legend(loc="upper right", fontsize=8)
    ax[2].set_ylabel("engines")
    ax[2].set_xlabel(f"seconds since the run started (windows of {horizon:g} s)")
    ax[0].set_title(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
