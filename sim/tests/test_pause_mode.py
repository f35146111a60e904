"""The weight sync's pause modes (SimConfig.pause_mode): ``abort`` aborts what the engines
run and re-prefills it; ``in_place`` (SGLang's pause_generation mode of that name) stops the
engines for ``weight_sync_s`` and lets what they hold go on; ``retract`` does the same after
the prefill and mixed engines take back the KV of what they run."""

from __future__ import annotations

from collections import Counter
from typing import get_args

import pytest

from prorsa_schemas import read_log
from prorsa_sim.runner import run_to_dir
from prorsa_emulated.weights import PauseMode
from prorsa_sim.simconfig import PAUSE_MODES, SimConfig, build_config
from prorsa_tracker.core import apply, new_state


def _events(path):
    state, out, anomalies = new_state(), [], []
    for line in read_log(path):
        assert line.ok, line.error
        state, _, an = apply(state, line.event)
        anomalies += an
        out.append(line.event)
    return out, anomalies


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for mode, policy in (("abort", "static:4:4"), ("in_place", "static:4:4"), ("retract", "colocation"),
                         ("in_place", "colocation")):
        cfg = SimConfig(workload="general", staleness=2, steps=3, batch_size=48, pause_mode=mode)
        d = tmp_path_factory.mktemp(mode)
        res = run_to_dir(cfg, policy, d, plot=False)
        out[mode if policy != "colocation" else f"{mode}/colocation"] = (cfg, res.summary, *_events(d / "events.jsonl.gz"))
    return out


def test_paused_in_place_nothing_is_aborted_and_the_decodes_under_way_go_on_after_the_sync(runs):
    cfg, summary, events, anomalies = runs["in_place"]
    assert anomalies == [] and summary["steps_done"] == cfg.steps
    assert not [e for e in events if e.type == "decode.finished" and e.finish == "abort"]
    assert set(Counter((e.traj, e.turn) for e in events if e.type == "request.queued").values()) == {1}
    updates = [e.ts for e in events if e.type == "policy.updated"][:-1]  # the last ends the run
    assert updates
    admitted = {e.req: e.ts for e in events if e.type == "prefill.finished"}
    for u in updates:
        # The engines stand still for the sync: no prefill and no decode ends in it ...
        assert not [e for e in events if e.type in ("prefill.finished", "decode.finished")
                    and u < e.ts < u + cfg.weight_sync_s]
        # ... and the decodes under way at the update end as turns after it.
        spanning = [e for e in events if e.type == "decode.finished" and e.ts > u and admitted.get(e.req, u) < u]
        assert spanning and {e.finish for e in spanning} <= {"tool", "stop", "length"}
        assert min(e.ts for e in spanning) >= u + cfg.weight_sync_s


def test_paused_by_aborts_the_decodes_under_way_re_prefill(runs):
    cfg, summary, events, anomalies = runs["abort"]
    assert anomalies == []
    aborts = [e for e in events if e.type == "decode.finished" and e.finish == "abort"]
    updates = {e.ts for e in events if e.type == "policy.updated"}
    assert aborts and {e.ts for e in aborts} <= updates
    # An engine that holds requests keeps its cache when paused in place; aborting them,
    # every engine is flushed.
    assert runs["in_place"][1]["cache_flushed_at_update_tokens"] < summary["cache_flushed_at_update_tokens"]


def test_paused_by_retraction_the_mixed_engines_re_prefill_what_they_ran_with_no_event(runs):
    cfg, summary, events, anomalies = runs["retract/colocation"]
    _, kept, _, _ = runs["in_place/colocation"]
    assert anomalies == [] and summary["steps_done"] == cfg.steps
    # Nothing is aborted and every turn is queued once: a retracted request goes on.
    assert not [e for e in events if e.type == "decode.finished" and e.finish == "abort"]
    assert set(Counter((e.traj, e.turn) for e in events if e.type == "request.queued").values()) == {1}
    # The engines were decoding at the updates: those requests gave their KV back and
    # were prefilled again (their prompt a cache hit, their output recomputed), which
    # the in-place pause does not do; every engine held requests, so none was flushed.
    assert summary["update_retractions"] > 0 and kept["update_retractions"] == 0
    assert summary["cache_flushed_at_update_tokens"] == 0
    admitted = {e.req: e.ts for e in events if e.type == "prefill.finished"}
    updates = [e.ts for e in events if e.type == "policy.updated"][:-1]
    for u in updates:
        spanning = [e for e in events if e.type == "decode.finished" and e.ts > u and admitted.get(e.req, u) < u]
        assert spanning and min(e.ts for e in spanning) >= u + cfg.weight_sync_s


def test_the_simulator_pauses_in_the_modes_the_emulated_engines_and_the_driver_take():
    assert PAUSE_MODES == get_args(PauseMode)


def test_an_unknown_pause_mode_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="unknown pause mode 'pause'; choose one of: abort, retract, in_place"):
        build_config(pause_mode="pause")
