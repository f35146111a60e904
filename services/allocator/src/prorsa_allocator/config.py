"""The allocator's tuning knobs (pure data: the service reads them from the environment,
the simulator and tests build them directly)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class AllocatorConfig(BaseModel):
    """Every constant the allocation and switch selection use, with why it has its default."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # -- capacity estimates ----------------------------------------------------------------
    prefill_tokens_per_s: float = Field(
        default=40_000.0,
        gt=0,
        description="Prior capacity of one prefill instance in computed (uncached) tokens/s, the "
        "unit engines report, until backlogged engines' samples replace it; θᴾ is the capacity over "
        "1 − the pool's hit ratio of the last 16 backlogged samples (0 before any). 40k: Dynamo's "
        "mocker prefill cost gives ~48k tokens/s for 4k-token chunks; a little lower because real "
        "batches are ragged.",
    )
    theta_window: int = Field(
        default=64, ge=1, description="Saturated prefill samples (engine.stats with a queue) whose "
        "computed rates θᴾ's capacity is taken from: 64 = 8 windows of 8 prefill engines.",
    )
    theta_prior_samples: int = Field(
        default=8, ge=0, description="Copies of the prior capacity the sample window starts with (one "
        "window of 8 prefill engines): an early sample from a barely busy engine cannot set θᴾ alone.",
    )
    theta_quantile: float = Field(
        default=0.75, gt=0, le=1, description="θᴾ's capacity is this quantile of those samples: the rate is a "
        "window's average and the queue an instant, so an engine idle for most of the window can "
        "look backlogged at a tiny rate (estimate.py); capacity is a high quantile, not a mean.",
    )
    max_cache_hit_rate: float = Field(
        default=0.95,
        ge=0,
        lt=1,
        description="Clip of the prefix-cache hit ratio used to turn computed-token throughput "
        "into full-prompt throughput (θ = rate / (1 - hit)); guards against one odd sample.",
    )
    gpus_prefill: int | None = Field(
        default=None, ge=1, description="mᴾ override (default: the GPUs of the registered engines)."
    )
    gpus_decode: int | None = Field(
        default=None, ge=1, description="mᴰ override (default: the GPUs of the registered engines)."
    )
    decode_tpot_target_s: float | None = Field(
        default=None,
        gt=0,
        description="Decode sizing by step time (decode.py): enough decode engines that a "
        "decode step (one token per running sequence) stays within this many seconds, as "
        "Dynamo's SLA planner sizes decode by an inter-token-latency target. None: off.",
    )
    decode_latency_balance: bool = Field(
        default=True,
        description="Size decode also by the latency it adds to every turn (decode.py "
        "decode_instances_for_latency): the decode demand that balances the marginal per-turn "
        "prefill wait against the marginal decode step time (square-root rule), so a decode "
        "engine holding every sequence is not kept just because its KV fits. Needs a decode "
        "step model (the priors below, or learned from engine.stats decode_tokens_per_s); "
        "without one the term is off. False: the paper's KV-only decode sizing.",
    )
    decode_latency_by_step: bool = Field(
        default=True,
        description="'priced' rule: the decode demand the latency-balance term adds beyond KV is "
        "worth the decode step speed-up a move buys (t(n)/t(n+k) with t(n) = t0 + c/n), not "
        "its share of engines (pricing.py priced_net). The term's instances come from the "
        "square-root rule and can be many times the pool when nothing is admitted (Little's law "
        "on a decode phase with no arrivals: async math between updates), while one more "
        "decode engine then shortens a step by about 1%.",
    )
    decode_spread_cap: bool = Field(
        default=True,
        description="Cap the decode demand beyond KV (the latency-balance and TPOT terms) at the "
        "engines the decode sequences can spread over: a decode engine steps its attention-DP "
        "ranks in lock-step, so once every rank holds at most one sequence (B sequences over R "
        "ranks an engine: B/R engines) another engine shortens no step (the step model becomes "
        "t(n) = t0 + c/min(n, B/R)). R is the engines' registered parallel.attn_dp (1 when "
        "absent). It binds where few sequences are left: a sync step's tail on a wide-DP engine "
        "(DeepSeek-V3.2, 16 ranks).",
    )
    decode_latency_room_cap: bool = Field(
        default=False,
        description="Cap the latency-balance term at the decode instances the budget leaves "
        "once prefill has ceil(prefill demand) instances (a saturated prefill role taken as "
        "the closed loop's only bottleneck). Off by default: on MiMo-V2.5-Pro general/2 the "
        "cap held the decode demand at 3 engines where 4:4 is the best fixed ratio, so the "
        "allocator sat at 5:3 (2.6% slower held fixed); the served-rate veto now keeps a "
        "decode-hungry term from taking a prefill engine the closed loop needs.",
    )
    decode_tpot_slack: float | None = Field(
        default=None,
        gt=0,
        description="The same, relative: the target is (1 + slack) x the empty-engine step "
        "t0 of the step model (0.1: no decode step more than 10% slower than an idle "
        "engine's). With both set, the tighter target wins. None: off.",
    )
    decode_step_fixed_s: float | None = Field(
        default=None, ge=0, description="Prior t0 of the per-engine decode step model (learned from "
        "engine.stats decode_tokens_per_s once decode engines report it at several loads).",
    )
    decode_step_per_seq_s: float | None = Field(
        default=None, ge=0, description="Prior seconds per running sequence per decode step (per engine)."
    )
    decode_step_per_kv_token_s: float | None = Field(
        default=None, ge=0, description="Prior seconds per KV token held per decode step (per engine)."
    )
    max_delta: float = Field(default=100.0, gt=0, description="Cap of the reported headroom δ.")

    # -- switch selection ---------------------------------------------------------------------
    actuate: bool = Field(
        default=True,
        description="False: advisory mode. Every plan is decided and published (allocation.plan "
        "with its switches) and logged, and no engine.command is sent: the engines keep their "
        "roles, and each plan advises what an acting allocator would command from the cluster as "
        "it is (no switch in flight, so no dwell or settling after a move it did not make). For "
        "watching the allocator beside a running job before letting it switch engines.",
    )
    rule: Literal["priced", "paper"] = Field(
        default="priced",
        description="The gain test. 'priced': every switch priced (dead time, re-prefill of "
        "what its drain aborts, prefix cache lost) over ``horizon_s``, free in the weight-update "
        "pause and planned there for the last step's steady demand, no switch in a step's opening "
        "(switching.py, planner.py, docs/allocator.md). "
        "'paper': the window's capacity ratio over ``lookahead_windows`` with drain x "
        "``drain_weight`` + switch time as the only cost (paper §4.2 with this allocator's "
        "switch execution; kept to compare).",
    )
    objective: Literal["auto", "capacity", "turn_latency", "saturation"] = Field(
        default="auto",
        description="'priced' rule: what a move must improve. 'capacity': the time-averaged "
        "bottleneck capacity-to-demand ratio (max-min, capped at ``ratio_cap``). 'turn_latency': "
        "the seconds a turn spends in the model, prefill wait plus decode (pricing.TurnLatency), "
        "averaged over the horizon; a saturated split (a role short of its work over the "
        "horizon) is judged by the capacity ratio; needs a decode step model and falls back to "
        "'capacity' without one. 'saturation': from a split whose roles keep up over the horizon "
        "no engine moves to prefill, and a move to decode is judged as under 'turn_latency'; a "
        "saturated split is judged as under 'turn_latency' (a synchronous step ends with its "
        "slowest trajectory, mostly decode: a faster decode step reaches it, shorter waits in a "
        "prefill queue that clears anyway do not). "
        "'auto': 'saturation' while every run the allocator has seen a run.started of is "
        "synchronous, 'capacity' otherwise (an asynchronous run, whose over-dispatch keeps the "
        "roles loaded, or no run.started yet). docs/allocator.md measures the four.",
    )
    horizon_s: float = Field(
        default=120.0,
        gt=0,
        description="'priced' rule: seconds over which a switch must pay back its price. "
        "CHOICE: about five drain-and-switch times of an in-place switch (10 s drain deadline "
        "+ 15 s switch on the simulated models), so a switch is bought for a demand that "
        "lasts several times what it takes, not for one window's.",
    )
    opening_hold_s: float = Field(
        default=120.0,
        ge=0,
        description="'priced' rule: no switch within this many seconds of a weight update, "
        "after its pause (a step's opening). CHOICE: the re-prefill burst after an update "
        "lasts 60-90 s on the simulated agentic settings (benchmarks/allocator_trace.py), "
        "shorter than a switch and the switch back; 0: off.",
    )
    opening_cache_ratio: float = Field(
        default=2.0,
        ge=0,
        description="'priced' rule: after a weight update the step's opening also lasts until "
        "the prefill pool's cache is back, its miss ratio (1 - hit) within this factor of its "
        "level over the windows the served rates were measured in; until then no switch is "
        "made and no served rate measured (served.CacheRegime). CHOICE: a prefill-bound pool "
        "at twice the reference miss ratio serves half the full-prompt tokens it serves warm, "
        "a transient no switch answers within its own dead time; a step's own hit varies by "
        "less (MiMo-V2.5-Pro general/0 under the default routing: 0.76 in a step's body, 0.85 "
        "in the windows measured, 1.6x the miss ratio; held as cold at 1.5 for the whole step). "
        "0: off.",
    )
    opening_cache_max_s: float = Field(
        default=600.0,
        gt=0,
        description="'priced' rule: the longest the opening waits for the cache "
        "(opening_cache_ratio); past it the reuse is taken to have changed and the reference "
        "restarts. CHOICE: about a DeepSeek-V3.2 coding step under the gateway's rule "
        "(680 s at 6:2), three times the longest cache rebuild measured (about 200 s).",
    )
    horizon_switch_multiple: float = Field(
        default=4.0,
        ge=1,
        description="'priced' rule: the horizon is at least this many times the slowest "
        "move's dead time (CHOICE: a switch must serve in its new role at least three times "
        "as long as it is dead).",
    )
    persist_dead_multiple: float = Field(
        default=0.0,
        ge=0,
        description="'priced' rule, outside the weight-update pause: an in-place move is made "
        "only once the engines have been off target in its direction for this many times the "
        "move's dead time (drain + switch). Ski rental, as for restarts: a burst shorter than "
        "what a switch takes is served by the split it meets. 0 (default): off. Measured with the "
        "default edited to "
        "1.0 (`prorsa sim run --policy prorsa --workload general --staleness 2 --steps 3 --start 4:4|6:2`): MiMo-V2.5-Pro 290.4 s -> "
        "277.5 s (9 -> 5 switches; 4:4 held: 263.4 s), DeepSeek-V3.2 264.4 s -> 265.5 s (3 -> 1; "
        "6:2 held: 261.4 s); with 2.0 MiMo 288.1 s. Not the default on two settings and one seed.",
    )
    served_alpha: float = Field(
        default=0.05,
        gt=0,
        le=1,
        description="'priced' rule: EMA weight of a window's served prefill rate in the rate "
        "measured at its prefill count (the plain mean over the first 1/alpha windows). CHOICE: "
        "about 20 windows of memory: one window's rate varies by +-10% on MiMo coding/2 at a "
        "fixed 6:2, more than the hysteresis; with 0.2 the veto let a 7:1 that served 5% less "
        "through whenever 6:2 had a slow minute.",
    )
    served_ramp_s: float | None = Field(
        default=120.0,
        ge=0,
        description="'priced' rule: windows that start within this many seconds of the run's "
        "first forecast are not measured (an empty cluster ramps up with the demand: its rates "
        "compare with nothing later). None: every rate measured before the first weight update "
        "is dropped at it.",
    )
    served_veto_yields_to_state: bool = Field(
        default=True,
        description="'priced' rule: the served-rate veto does not apply while the engines show "
        "the move's need now (the role it feeds saturated, the other idle: pricing.role_pressed). "
        "A rate measured in one phase of a step says little of the next: where a step alternates "
        "prefill- and decode-bound phases (MiMo-V2.5-Pro coding/8), a veto that does not yield "
        "holds the split through every phase that needs the move (docs/allocator.md).",
    )
    served_evidence_first: bool = Field(
        default=True,
        description="'priced' rule: until some prefill count has a served rate (served_min_samples "
        "windows), no move is made on the forecast alone, only while the engines show a shortage "
        "the move relieves (pricing.role_pressed with short: a decode queue counts only with the "
        "decode KV at least half used). Before then the gain rests on priors (θᴾ, the decode step "
        "model, a decode turn read off a cluster still filling) whose error nothing has measured, "
        "and the start split is the one measured against. Without it (benchmarks/allocator_trace.py, "
        "seed 0, 3 steps, from the best fixed ratio): DeepSeek-V3.2 general/8 7:1 -> 6:2 at "
        "t = 30 s (218.2 s; 7:1 held 203.8 s), MiMo-V2.5-Pro general/8 5:3 -> 6:2 -> 4:4 in the "
        "first 40 s (235.5 s; 5:3 held 227.6 s). False: the forecast alone from the first window.",
    )
    served_evidence_idle_share: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="'priced' rule, with served_evidence_first, under the 'turn_latency' and "
        "'saturation' objectives (a synchronous run's): before any served rate, a move "
        "to decode may still be made while no prefill engine queues and the forecast's prefill "
        "demand (at the prior θᴾ, every prompt token computed) is at most this share of the "
        "prefill engines left after it (pricing.prefill_room). CHOICE: 0.5 leaves the forecast "
        "room to be off by 2x in the run's first windows; a pool that short of work gives no "
        "served rate to wait for (its engines never queue: MiMo-V2.5-Pro math/0 from 4:4 asks "
        "for 0.01-0.21 prefill engines in its first windows). Not under the capacity ratio (an "
        "asynchronous run's): each weight update brings back a re-prefill burst that the windows "
        "between bursts do not show (with it, seed 0 from the best fixed ratio: DeepSeek-V3.2 "
        "math/8 from 4:4 250.0 s against 230.4 s, MiMo-V2.5-Pro math/8 from 2:6 296.0 s "
        "against 283.6 s). 0: no move to decode before a served rate.",
    )
    served_capacity_ceiling: bool = Field(
        default=True,
        description="'priced' rule: where the current count's prefill engines queued (pricing.IDLE_QUEUE, "
        "0.5 requests per engine or more, over the windows its served rate was measured in), a "
        "prefill count never held below it is judged by the most its prefill engines can serve, "
        "count x θᴾ: a move to decode is vetoed like a move to a count that served less when that "
        "is not more than the current count served by the hysteresis (in a closed rollout loop "
        "the turns go round at the prefill rate served). Yields to the engines' state as the "
        "served-rate veto does. Only where prefill queues: θᴾ is measured on backlogged engines, "
        "and a role that rarely queues serves more than its few samples say (MiMo-V2.5-Pro "
        "general/2 at 5:3: 76k tokens/s an engine at θᴾ 79k, and 4:4 is faster). Not while the "
        "decode pool's KV is full (pricing.decode_full): the rollout then goes at the rate decode "
        "frees KV, and prefill's capacity alone bounds nothing (a rate measured at the other "
        "count, the closed loop's answer there, still vetoes). DeepSeek-V3.2 "
        "general/8 at 7:1 serves 583k tokens/s, 6 x θᴾ = 528k: without the ceiling the allocator "
        "moves to 6:2 as soon as 7:1 is measured (217.5 s; 7:1 held 203.8 s).",
    )
    served_min_samples: int = Field(
        default=3,
        ge=1,
        description="'priced' rule: windows measured at a prefill count before its served rate "
        "can veto a move to it (CHOICE: three windows, 30 s, a few turns of an agentic step).",
    )
    served_memory_s: float = Field(
        default=7200.0,
        gt=0,
        description="'priced' rule: a prefill count's served rate older than this no longer "
        "vetoes (the demand it was measured under has moved on). CHOICE: about three agentic "
        "steps on MiMo coding/2 (~2,200 s each): an RL run's steps repeat their demand, so one "
        "step's evidence holds for the next. Measured there (seed 0, 3 steps, from 6:2): 600 s "
        "2286.6 s rollout, 1800 s 2287.9 s, 7200 s 2240.9 s; a shorter memory lets the "
        "6:2 -> 7:1 flip recur each time its evidence expires.",
    )
    drain_deadline_s: float = Field(
        default=10.0,
        ge=0,
        description="The engine agent's drain deadline: what still runs this long after the "
        "command is aborted and re-queued (the simulator's DRAIN_DEADLINE_S, 10 s). Bounds a "
        "decode engine's drain; what it aborts is re-prefilled.",
    )
    weight_sync_s: float = Field(
        default=5.0,
        ge=0,
        description="Length of the weight-update pause after policy.updated (the simulator's "
        "weight_sync_s, 5 s). Every engine is empty then: a switch requested in it needs no "
        "drain, aborts nothing and loses no cache (already flushed).",
    )
    min_dwell_s: float = Field(
        default=30.0,
        ge=0,
        description="An engine keeps a role at least this long; and no switch reverses the "
        "direction of the previous one within this time (anti-flapping).",
    )
    lookahead_windows: int = Field(
        default=6,
        ge=1,
        description="Windows over which a switch must pay back its cost (6 x 10 s: an in-place "
        "switch of seconds pays off, a restart of minutes only on a long, large imbalance).",
    )
    restart_lookahead_s: float = Field(
        default=1200.0,
        ge=0,
        description="Horizon over which a RESTART switch must pay back (when longer than the "
        "lookahead). A restart takes minutes, so over 60 s it never pays and a restart-only "
        "cluster (stock SGLang with EP > 1) would keep its initial ratio forever; 1200 s is about "
        "one agentic rollout step. The demand after the current window is the smoothed forecast, "
        "so only a persistent imbalance justifies one. 0: restarts are judged like in-place switches.",
    )
    hysteresis: float = Field(
        default=0.05,
        ge=0,
        description="A switch must raise the time-averaged bottleneck capacity-to-demand ratio "
        "by at least this fraction (0.05: +5%), net of its cost.",
    )
    ratio_cap: float = Field(
        default=2.0,
        gt=1,
        description="Capacity beyond this multiple of demand is worth nothing more in the gain "
        "test (so a huge surplus in one role never justifies a switch by itself).",
    )
    forecast_alpha: float = Field(
        default=0.3,
        gt=0,
        le=1,
        description="EMA weight of the newest forecast in the demand assumed for the windows "
        "after the current one (damps an oscillating forecast).",
    )
    steady_floor: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="'priced' rule: a window enters the steady demand that the weight-update "
        "pause plans for only when its demand (aᴾ + aᴰ, in instances) is at least this share of "
        "the largest one since the last update. CHOICE 0.5: a sync step ends in a tail of "
        "stragglers in which the demand decays to nothing; the split the next step needs is the "
        "one the windows that load the cluster ask for, not the tail's. 0: every window.",
    )
    prefill_backlog_once: bool = Field(
        default=False,
        description="'priced' rule, capacity ratio: the prefill work over the lookahead is the "
        "current window's forecast (its backlog queued at the window's start and its arrivals) "
        "and then the arrivals' smoothed rate (planner.prefill_fed_share of each forecast): a "
        "backlog is counted once. Off (the default): the smoothed rate of every window's whole "
        "forecast, which counts a backlog again in each window it still waits in, so a burst "
        "reads as a rate that lasts the lookahead. The capacity ratio has no term for the time "
        "a backlog waits; counted in every window, a burst is cleared sooner. Measured (seed 0, "
        "6 steps, docs/allocator.md 'Counting a backlog once'): on, MiMo-V2.5-Pro coding/8 "
        "from 6:2 takes 3,010.0 s with 2 switches against 2,681.6 s and 42, coding/2 from 6:2 "
        "2,371.4 s against 2,146.1 s; coding/2 under SGLang Model Gateway's rule from 5:3 holds "
        "5:3 (1,557.4 s against 1,662.3 s over 3 steps).",
    )
    provision_quantile: float | None = Field(
        default=None,
        ge=0.5,
        le=1.0,
        description="'priced' rule: a move that takes engines from prefill judges prefill's "
        "demand after the current window at no less than this quantile of its forecast rate over "
        "the last ``provision_memory_s`` (provisioning the donor role to a quantile of the demand "
        "it has shown, not to its smoothed level), so that a calm spell between recurring bursts "
        "does not give away the engines the next burst needs. None: the smoothed level "
        "(``forecast_alpha``). docs/allocator.md, 'Provisioning to a quantile', measures it.",
    )
    provision_memory_s: float = Field(
        default=600.0,
        gt=0,
        description="'priced' rule: the forecast windows ``provision_quantile`` is taken over. "
        "CHOICE: 600 s, a few hundred seconds to one agentic step: long enough to hold the last "
        "re-prefill burst after a weight update, short enough to forget a step's demand once "
        "the workload has moved on.",
    )
    settle_s: float = Field(
        default=120.0,
        ge=0,
        description="'priced' rule: after a plan moves engines toward a role, no further move "
        "toward that role for this many seconds (a move back is the dwell's business). The "
        "plan was judged over the horizon; its switches land after their dead time and the "
        "closed loop answers a turn later (the decode it frees returns as prefill after a tool "
        "call, and the reverse), so until then the windows still show the imbalance the plan "
        "answered, and a second move would answer it twice. CHOICE: the horizon's default. "
        "0: off.",
    )
    closed_loop_coupling: float = Field(
        default=1.0,
        ge=0,
        le=1,
        description="'priced' rule: how much of each role's work over the horizon is fed by "
        "what the other role finishes (a rollout is a closed loop: a decode turn ends in a "
        "tool call whose result is the next prefill; a prefill feeds a decode). A role short "
        "of capacity passes on only the share it serves, so a move that lets it serve more "
        "raises the other role's work in proportion: g = min(1, ratio after) / min(1, ratio "
        "before); prefill work x (1 + coupling x (g_D - 1)), and the share of the decode "
        "demand the window's admissions bring (K̂ᴰ/(Kᴰ + K̂ᴰ); resident KV is not fed) x "
        "(1 + coupling x (g_P - 1)). 1: every turn's work is fed by the loop (multi-turn "
        "agents; a step's first prompts are not, which 1 overstates); 0: the forecast's work "
        "taken as given, whatever the split.",
    )
    max_switch_fraction: float = Field(
        default=0.25,
        gt=0,
        le=1,
        description="At most this fraction of the PD engines is commanded in one plan.",
    )
    initial_switch_fraction: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="The cap of the FIRST plan that switches (no switch commanded yet). "
        "max_switch_fraction bounds the capacity one possibly wrong forecast can take out "
        "of a ratio that was itself chosen from forecasts; the registered roles were chosen "
        "by nobody (N/2 : N/2 in the simulator), so moving to the first target in one step "
        "is limited only by the gain-vs-cost test and one engine kept per role. 1.0: no "
        "extra cap; set it to max_switch_fraction for the old behaviour.",
    )
    drain_prefill_s: float = Field(
        default=2.0, ge=0, description="Expected drain of a busy prefill engine (its queue finishes)."
    )
    drain_decode_s: float = Field(
        default=20.0,
        ge=0,
        description="Expected drain of a busy decode engine (running generations finish or are "
        "aborted at the deadline); idle engines drain in 0 s.",
    )
    drain_weight: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="Fraction of the drain time counted as lost capacity: a draining engine "
        "still serves the requests it holds.",
    )
    in_place_switch_s: float = Field(
        default=5.0, ge=0, description="Prior cost of /pd_role_switch after drain (learned from engine.switched)."
    )
    restart_switch_s: float = Field(
        default=390.0,
        ge=0,
        description="Prior cost of a restart in the other role (6.5 min reported for "
        "Qwen3-235B FP8 on 4 GPUs; learned from engine.switched).",
    )
    switch_cost_alpha: float = Field(default=0.3, gt=0, le=1, description="EMA weight of a measured switch time.")

    # -- command tracking ------------------------------------------------------------------------
    deadline_slack: float = Field(
        default=2.0, ge=1, description="A command's deadline is now + slack x (drain + switch estimate)."
    )
    min_deadline_s: float = Field(default=30.0, gt=0, description="Shortest deadline given to a command.")
    ack_grace_s: float = Field(
        default=10.0,
        ge=0,
        description="After the deadline and the engine's switch time (the agent aborts what is left at "
        "the deadline, then switches), how long more to wait for engine.switched before retrying.",
    )
    max_attempts: int = Field(
        default=2, ge=1, description="Sends of one command (the first and the retries) before it is abandoned."
    )
    failure_cooldown_s: float = Field(
        default=120.0, ge=0, description="An engine whose switch failed or was abandoned is left alone this long."
    )

    # -- forecasts -----------------------------------------------------------------------------------
    stale_after_windows: float = Field(
        default=2.0,
        gt=0,
        description="A forecast whose window started more than this many horizons before the "
        "current event time is stale and ignored.",
    )
    run: str | None = Field(default=None, description="Act only on forecasts of this run (None: any).")
