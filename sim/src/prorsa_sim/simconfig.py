"""One simulation's settings (:class:`SimConfig`, every field a CLI option of ``prorsa sim
run``) and their validation (:func:`build_config`)."""

from __future__ import annotations

from dataclasses import dataclass

from prorsa_emulated.costmodel import CLUSTER_GPUS, get_profile
from prorsa_schemas import events as E

from .cluster import DP_ROUTING, ROUTER_POLICIES
from .workloads import get_workload

PAUSE_MODES = ("abort", "retract", "in_place")
"""The weight sync's pause modes: SGLang's ``pause_generation`` modes, the same as the
emulated engines' and the live demo driver's (``prorsa_emulated.weights.PauseMode``, not
imported: it would load the HTTP server's modules into every simulation)."""


@dataclass(frozen=True)
class SimConfig:
    """One simulation. Every field is a CLI option of ``prorsa sim run``."""

    workload: str = "coding"
    model: str = "deepseek-v3.2"
    staleness: int = 0
    """0: synchronous (on-policy); >0: asynchronous with this maximum staleness."""
    steps: int = 6
    """Rollout steps (sync) / policy updates (async). The first is the warm-up step (it
    starts from an empty cluster) and is reported apart; the rollout time is the mean of
    the others. CHOICE: 6 = one warm-up + 5 measured steps."""
    seed: int = 0
    batch_size: int = 512
    """Trajectories per training step ([P] paper scale: 512)."""
    total_gpus: int = CLUSTER_GPUS
    window_s: float = E.DEFAULT_WINDOW_S
    """Policy window S ([P] Appendix B default 10 s)."""
    train_s: float = 30.0
    """CHOICE: training time of one step on the trainer GPUs (not rollout GPUs)."""
    weight_sync_s: float = 5.0
    """CHOICE: rollout engines paused while new weights load."""
    pause_mode: str = "abort"
    """How the weight sync pauses the engines (SGLang's ``pause_generation`` mode,
    :data:`PAUSE_MODES`): ``abort`` (default; slime's and AReaL's: every request in flight
    is aborted and re-prefills with its context after the sync, and every prefix cache is
    flushed) or ``in_place`` (the engines stop stepping and keep what they hold, which goes
    on after the sync; a cache is flushed only on an engine that holds nothing, as SGLang
    refuses the flush otherwise) or ``retract`` (as ``in_place``, but prefill and mixed
    engines first take back the KV of what they run, which re-prefills after the sync with
    its prompt a cache hit; a PD decode engine keeps its batch: SGLang offloads its KV to
    host memory and loads it back)."""
    over_dispatch: float | None = None
    """CHOICE: async keeps up to over_dispatch x batch_size trajectories live; default
    1 + staleness / 4 (1.5x at staleness 2, 3x at 8): a looser bound lets the sampler run
    further ahead, within the AReaL-style launch budget below."""
    dp_routing: str = "load"
    """How the attention-DP rank of a request is chosen (``cluster.DP_ROUTING``): ``load``
    (default: SGLang's data-parallel controller balances ranks by load, so a prefix is reused
    only when the chosen rank holds it) or ``prefix`` (a DP-aware, cache-aware router)."""
    router_policy: str = "queue"
    """The router's rule between the worker holding a request's prefix and a less loaded
    one (``cluster.ROUTER_POLICIES``): ``queue`` (default: the prefix's rank unless its
    queue, less the cached part, is longer than the least-loaded rank's) or ``smg`` (SGLang
    Model Gateway's ``cache_aware`` policy with its default thresholds)."""
    max_turns: int | None = None
    """A cap on each trajectory's turns (None: the workload's own); with ``max_output`` and
    ``group_prefix=False`` the live demo's scenario (its rollout driver caps turns and
    outputs to keep a run short)."""
    max_output: int | None = None
    """A cap on each turn's output tokens (None: the workload's own)."""
    group_prefix: bool = True
    """The members of a GRPO group share their first prompt and its prefix cache (False:
    each trajectory's prompt is its own, as the live driver's prompt texts are)."""
    run: str = "sim"
    max_sim_s: float = 200_000.0
    """Safety stop (simulated seconds)."""

    @property
    def mode(self) -> str:
        return "sync" if self.staleness == 0 else "async"


def build_config(**kw) -> SimConfig:
    """Validate and build a :class:`SimConfig` (raises ValueError with a clear reason)."""
    get_workload(kw.get("workload", "coding"))
    get_profile(kw.get("model", "deepseek-v3.2"))
    if kw.get("dp_routing", "load") not in DP_ROUTING:
        raise ValueError(f"unknown dp routing {kw['dp_routing']!r}; choose one of: {', '.join(DP_ROUTING)}")
    if kw.get("router_policy", "queue") not in ROUTER_POLICIES:
        raise ValueError(f"unknown router policy {kw['router_policy']!r}; choose one of: {', '.join(ROUTER_POLICIES)}")
    if kw.get("pause_mode", "abort") not in PAUSE_MODES:
        raise ValueError(f"unknown pause mode {kw['pause_mode']!r}; choose one of: {', '.join(PAUSE_MODES)}")
    for cap in ("max_turns", "max_output"):
        if kw.get(cap) is not None and kw[cap] < 1:
            raise ValueError(f"--{cap.replace('_', '-')} must be >= 1, got {kw[cap]}")
    return SimConfig(**kw)
