"""The forecast for [t, t+S): ``forecast(snapshot, history, config) -> Forecast``.

Pure: no I/O, no clock; the same snapshot and history always give the same forecast, and
no term loops over trajectories in Python. Appendix B's terms, one module each under
``terms/``, composed here:

* prefill demand W-hat^P = the sampler's launches (:mod:`.terms.sampler`, B.2) + sandbox
  start-ups (:mod:`.terms.sandbox`, B.3) + the ready queue (:mod:`.terms.ready`, B.4) +
  tool returns and the next turns (:mod:`.terms.tool`, B.5) + in-flight prefills
  (:mod:`.terms.inflight`, B.6) + the re-prefills after a weight update, and of the
  requests an abort cut short, when they are re-sent (:mod:`.terms.update`);
* decode admissions A-hat^D and K-hat^D: the known requests and the predicted arrivals
  through the prefill queues (:mod:`.terms.decode_admit`, B.7);
* each predicted source scaled by its online correction, and the lifecycle forecast
  blended with the naive predictors by running WAPE (:mod:`.terms.correction`, B.8).

Each arrival term returns loads per service class and sub-step (:mod:`.terms.common`), so
the decode admissions know when the requests come and how long their prefill takes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from prorsa_schemas import ForecastComponents

from .config import ForecastConfig
from .guards import clean, finite_sum
from .history import History
from .snapshot import Snapshot
from .terms import inflight, ready, sampler, sandbox, tool, update
from .terms.common import class_sums, pooled_cost, rows, service_class
from .terms.correction import UPDATE_WINDOWS
from .terms.decode_admit import AdmitDetail, PendingUpdate, decode_admissions_split
from .terms.known_queue import known_queue

COMPONENTS = ("sampler", "sandbox", "ready", "tool", "inflight", "reprefill")
PREDICTED = ("sampler", "sandbox", "tool", "reprefill")


@dataclass(frozen=True)
class Forecast:
    """One window's forecast.

    ``prefill_tokens`` = W-hat^P (bias-corrected), ``decode_admit_tokens`` = A-hat^D,
    ``decode_kv_tokens`` = K-hat^D, ``decode_kv_now`` = K^D. ``components`` holds the
    uncorrected per-source prefill terms; ``bias`` the token amount the correction added
    (may be negative). ``predicted_prefill`` is the part that is a prediction (sampler +
    sandbox + tool), which is what the bias correction scales; ``raw_decode`` the
    uncorrected A-hat^D, ``raw_decode_known`` its part from requests queued or in
    prefill at t. ``share_factor`` is the correction of the predicted arrivals' admitted
    share (already in ``raw_decode``), ``raw_alpha`` that share per sub-step before it.
    """

    t: float
    horizon: float
    prefill_tokens: float
    decode_admit_tokens: float
    decode_kv_tokens: float
    decode_kv_now: float
    components: dict[str, float] = field(default_factory=dict)
    bias: float = 0.0
    decode_bias: float = 0.0
    predicted_prefill: float = 0.0
    raw_decode: float = 0.0
    raw_decode_known: float = 0.0
    share_factor: float = 1.0
    raw_alpha: tuple[float, ...] = ()
    admit_detail: AdmitDetail = field(default_factory=AdmitDetail)
    model_prefill: float = 0.0
    """The lifecycle forecast of prefill demand (corrected), before the blend with the
    naive predictors; ``model_decode`` likewise."""
    model_decode: float = 0.0
    new_model: float = 0.0
    """New trajectories' arrivals: the sampler term (corrected), which the lifecycle
    forecast counts with its weight ``weights["new"]["lifecycle"]``, plus ``new_series``
    tokens from the naive predictors of that series (weighted)."""
    new_series: float = 0.0
    weights: dict[str, dict[str, float]] = field(default_factory=dict)
    """The blend's weights per series (``prefill``, ``decode``: the lifecycle forecast, the
    same scaled, and each naive predictor; ``new``: the sampler term and the naive
    predictors of new trajectories' arrivals)."""
    around_update: bool = False
    """A weight update may land in the window or landed less than
    ``correction.UPDATE_WINDOWS`` windows before it: the blends of such windows apply."""

    def contract_components(self) -> ForecastComponents:
        """``forecast.window``'s ``components`` for this forecast. The contract has no field
        for re-prefill after a weight update: it is part of the sampler/policy cycle, so it
        is published inside ``sampler``."""
        c = self.components
        return ForecastComponents(sampler=c["sampler"] + c.get("reprefill", 0.0), sandbox=c["sandbox"],
                                  ready=c["ready"], tool=c["tool"], inflight=c["inflight"], bias=self.bias)


def forecast(snap: Snapshot, hist: History, cfg: ForecastConfig | None = None) -> Forecast:
    """The forecast for [snap.t, snap.t + S): every term, corrected, then blended."""
    cfg = cfg or hist.config
    corr = hist.correction
    with np.errstate(all="ignore"):  # inputs are guarded; results are checked below
        cost = pooled_cost(snap)
        kq = known_queue(snap)
        landing = update.update_steps(snap, hist, cfg)  # Pr(a pending weight update in sub-step k)
        loads = {  # predicted arrivals: (4, N_CLASSES, steps) each
            "sampler": sampler.term(snap, hist, cfg, cost),
            "sandbox": sandbox.term(snap, hist, cfg, cost),
            "tool": tool.term(snap, hist, cfg, cost, kq, landing),
        }
        re_if = update.reprefill_loads(snap, hist, cost, landing)  # if it lands: (4, N_CLASSES)
        requeued = update.requeues(snap, hist, cfg, cost)  # aborted by a landed update (or a drain)
        comps = {name: finite_sum(x[1]) for name, x in loads.items()}
        comps.update(ready=ready.term(snap), inflight=inflight.term(snap),
                     reprefill=finite_sum(re_if[1]) * float(landing.sum()) + finite_sum(requeued[1]))
        known = comps["ready"] + comps["inflight"]

        # Each predicted source by its bias factor; new trajectories' arrivals blend the
        # sampler term with the naive predictors of their series (a level that arrives
        # evenly through the window as requests of the mean first prompt).
        fs = corr.factors()
        w_samp, level = corr.new.split()
        new = w_samp * fs["sampler"] * comps["sampler"] + level
        model = known + new + sum(fs[k] * comps[k] for k in ("sandbox", "tool", "reprefill"))
        future = (loads["sampler"] * (fs["sampler"] * w_samp) + loads["sandbox"] * fs["sandbox"] + loads["tool"] * fs["tool"]
                  + requeued * fs["reprefill"])
        future = clean(future) + _evenly(level, hist.first_prompt.value, snap, cost, cfg.steps)

        # Decode admissions: the re-prefills come with a pause and flushed caches (where
        # the framework aborts what runs), so the queue model takes them as a mixture
        # over when the update lands.
        pending = None
        if landing.sum() > 0:
            pause = hist.update_pause.value if hist.update_pause.n else 0.0
            pending = PendingUpdate(landing, pause, clean(re_if.sum(axis=1) * fs["reprefill"]),
                                    flush=1.0 if hist.update_flushes else 0.0)
        known_admit, arriving, kv, detail = decode_admissions_split(snap, cfg, future, pending, kq)
        corrected, alpha = corr.admitted_share(detail.alpha, detail.arrival_tokens, arriving)
        kv += corrected - arriving  # K^D counts the arrivals' tokens as they are
        admit = known_admit + corrected
        decode_model = admit * corr.decode.factor

        # What is published: each series' lifecycle forecast blended with its naive ones,
        # by the weights learnt on windows like this one (near a weight update or not).
        since = snap.since_update
        around = bool(landing.sum() > 0 or (math.isfinite(since) and 0 <= since < UPDATE_WINDOWS * cfg.horizon))
        prefill = corr.prefill_blend.combine(model, known, around)
        decode = corr.decode_blend.combine(decode_model, around=around)
    predicted = sum(comps[k] for k in PREDICTED)
    return Forecast(
        t=snap.t, horizon=cfg.horizon,
        prefill_tokens=_ok(prefill), decode_admit_tokens=_ok(decode),
        decode_kv_tokens=_ok(kv * decode / admit if admit > 0 else kv), decode_kv_now=_ok(snap.decode_kv_now),
        components={k: _ok(v) for k, v in comps.items()},
        bias=_finite(prefill - known - predicted), decode_bias=_finite(decode - admit),
        predicted_prefill=_ok(predicted), raw_decode=_ok(admit), raw_decode_known=_ok(known_admit),
        share_factor=float(corr.share.factor), raw_alpha=detail.alpha,
        admit_detail=AdmitDetail(tuple(float(a) for a in alpha), detail.known_var, detail.arrival_tokens),
        model_prefill=_ok(model), model_decode=_ok(decode_model),
        new_model=_ok(fs["sampler"] * comps["sampler"]), new_series=_ok(level),
        weights={"prefill": corr.prefill_blend.pick(around).named(), "decode": corr.decode_blend.pick(around).named(),
                 "new": corr.new.blend.named()},
        around_update=around,
    )


def _evenly(tokens: float, prompt: float, snap: Snapshot, cost: np.ndarray, steps: int) -> np.ndarray:
    """``tokens`` arriving evenly over the sub-steps as requests of ``prompt`` tokens:
    loads ``(4, N_CLASSES, steps)``."""
    one = rows(snap, np.array([max(prompt, 1.0)]))
    per = class_sums(one, service_class(one, cost)) * (max(tokens, 0.0) / max(prompt, 1.0) / steps)
    return clean(np.repeat(per[:, :, None], steps, axis=2))


def _ok(v: float) -> float:
    return float(v) if np.isfinite(v) and v > 0 else 0.0


def _finite(v: float) -> float:
    return float(v) if np.isfinite(v) else 0.0
