"""The measurement rule (warm-up apart, common start, seeds in parallel, cache), the ideal
split, ``prorsa sim calibrate`` and ``prorsa sim paper`` on small settings."""

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from prorsa_cli.main import app
from prorsa_sim.calibrate import calibrate_profile, prefill_stream_rate
from prorsa_emulated.costmodel import get_profile
from prorsa_sim.idealsplit import decode_batch_limit, ideal_windows, movement, prefill_rate_per_engine
from prorsa_sim.paper import miss
from prorsa_sim.catalog import make_policy
from prorsa_sim.compare import compare_seeds
from prorsa_sim.runner import Job, run_jobs
from prorsa_sim.simconfig import SimConfig
from prorsa_sim.simulator import Simulator

SMALL = SimConfig(workload="general", model="deepseek-v3.2", staleness=0, steps=3, batch_size=16, total_gpus=64)


def test_the_warmup_step_is_reported_apart():
    s = Simulator(SMALL, make_policy("colocation")).run().summary
    steps = s["step_times_s"]
    assert len(steps) == 3 and s["measured_steps"] == 2
    assert s["warmup_step_s"] == steps[0]
    assert s["rollout_time_s"] == pytest.approx((steps[1] + steps[2]) / 2, abs=2e-3)
    one = Simulator(replace(SMALL, steps=1), make_policy("colocation")).run().summary
    assert one["measured_steps"] == 0 and one["rollout_time_s"] == one["warmup_step_s"] == one["step_times_s"][0]
    # The warm-up is the first step of the longer run too (same seed, same start).
    assert one["warmup_step_s"] == s["warmup_step_s"]


def test_every_pd_policy_starts_from_the_best_static_split_and_seeds_aggregate():
    res = compare_seeds(SMALL, ["colocation", "static", "reactive"], [0, 1], n_jobs=1)
    rows = {r["spec"]: r for r in res["rows"]}
    for i, seed in enumerate([0, 1]):
        best = rows["static"]["per_seed"][i]["policy"]
        p, d = (int(x) for x in best.split(":")[1:])
        assert rows["reactive"]["per_seed"][i]["initial_roles"] == {"prefill": p, "decode": d, "mixed": 0}
        assert rows["reactive"]["per_seed"][i]["start"] == f"{p}:{d}"
        assert rows["colocation"]["per_seed"][i]["initial_roles"]["mixed"] == 4
        assert rows["colocation"]["per_seed"][i]["seed"] == seed
    times = [s["rollout_time_s"] for s in rows["static"]["per_seed"]]
    spread = rows["static"]["rollout_time_s"]
    assert spread["mean"] == pytest.approx(sum(times) / 2, abs=1e-3)
    assert spread["min"] == min(times) and spread["max"] == max(times)
    assert rows["colocation"]["speedup"]["mean"] == 1.0
    per = rows["static"]["speedup_per_seed"]
    assert per[0] == pytest.approx(rows["colocation"]["per_seed"][0]["rollout_time_s"] / times[0], abs=1e-3)


def test_parallel_runs_equal_serial_ones_and_the_cache_resumes(tmp_path):
    jobs = [Job(replace(SMALL, steps=2, seed=s), spec) for s in (0, 1) for spec in ("colocation", "static:2:2")]
    serial = run_jobs(jobs, n_jobs=1)
    parallel = run_jobs(jobs, n_jobs=2, cache_dir=tmp_path)
    assert serial == parallel
    files = sorted((tmp_path / "runs").glob("*.json"))
    assert len(files) == 4
    # A cached result is read back, not recomputed: mark one file and see the mark.
    doc = json.loads(files[0].read_text())
    doc["summary"]["marker"] = "from-cache"
    files[0].write_text(json.dumps(doc))
    seen = []
    again = run_jobs(jobs, n_jobs=1, cache_dir=tmp_path, progress=seen.append)
    assert len(seen) == 4 and sum(r.get("marker") == "from-cache" for r in again) == 1


def test_miss_inside_below_above_and_point_figures():
    assert miss(3.0, 2.54, 4.05) == {"within": True, "miss_abs": 0.0, "miss_rel": 0.0, "band": [2.54, 4.05], "point": False}
    below = miss(1.27, 2.54, 4.05)
    assert below["within"] is False and below["miss_abs"] == pytest.approx(-1.27) and below["miss_rel"] == pytest.approx(-0.5)
    above = miss(0.75, 0.3621, 0.5998)
    assert above["miss_abs"] == pytest.approx(0.1502) and above["miss_rel"] == pytest.approx(0.75 / 0.5998 - 1, abs=1e-6)
    # A point figure: +-10% around it.
    assert miss(105.0, 100.0)["within"] is True
    pt = miss(80.0, 100.0)
    assert pt["within"] is False and pt["band"] == [90.0, 110.0] and pt["miss_abs"] == pytest.approx(-10.0)
    assert miss(None, 1.0, 2.0)["within"] is None


def test_ideal_split_by_hand():
    prof = get_profile("deepseek-v3.2")
    theta = prefill_rate_per_engine(prof, 1000)
    assert theta == pytest.approx(16 * 512 / prof.prefill_time(512, 1000))
    b = decode_batch_limit(prof, 4000)
    limit = 1.25 * prof.decode_step_time(1, 4000)
    assert prof.decode_step_time(b, b * 4000) <= limit < prof.decode_step_time(b + 1, (b + 1) * 4000)
    rows = [
        # Window 0: 4 prefills finished, half their prompt tokens cached, mean cached prefix 1000.
        {"t": 0.0, "step": 1, "prefill_demand": 10_000_000, "prefills_done": 4, "prefill_prompt_done": 8000,
         "prefill_cached_done": 4000, "decode_kv_tokens": 2 * prof.kv_capacity_tokens, "decode_seqs": 100},
        # Window 1: no prefill finished (the hit ratio and prefix carry over), nothing queued.
        {"t": 10.0, "step": 1, "prefill_demand": 0, "decode_kv_tokens": 0, "decode_seqs": 0},
        {"t": 20.0, "step": 1, "prefill_demand": 1_000_000, "decode_kv_tokens": 400_000, "decode_seqs": 100},
    ]
    out = ideal_windows(rows, prof, 8, 10.0)
    p0 = 10_000_000 * 0.5 / (10.0 * theta)
    assert out[0]["prefill_need"] == pytest.approx(p0, abs=1e-4)
    assert out[0]["decode_need_kv"] == pytest.approx(2.0)
    assert out[0]["ideal_prefill"] == min(7, max(1, round(8 * p0 / (p0 + max(2.0, out[0]["decode_need_step"])))))
    assert out[1]["ideal_prefill"] is None  # no demand at all
    d_step = 100 / (decode_batch_limit(prof, 4000) * 16)
    assert out[2]["decode_need_step"] == pytest.approx(d_step, abs=1e-4)
    assert out[2]["prefill_need"] == pytest.approx(1_000_000 * 0.5 / (10.0 * theta), abs=1e-4)
    mv = movement(out)
    assert len(mv) == 1 and mv[0]["windows"] == 2
    assert mv[0]["moves"] == abs(out[0]["ideal_prefill"] - out[2]["ideal_prefill"])


def test_calibration_by_hand_and_cli_json():
    prof = get_profile("deepseek-v3.2")
    # Two 1024-token prompts in 512-token chunks: four chunks, the second of each at context 512.
    t = 2 * (prof.prefill_time(512, 0) + prof.prefill_time(512, 512))
    assert prefill_stream_rate(prof, input_tokens=1024, n_requests=2) == pytest.approx(2048 / t)
    c = calibrate_profile(prof)
    for row in c["lockstep"]:
        pf = prof.prefill_time(prof.chunk_size, row["chunk_context_tokens"])
        d = row["decode_rank_in_extend_step_ms"] / 1e3
        step = max(pf, d)
        assert row["step_with_chunk_ms"] == pytest.approx(1e3 * step, abs=1e-3)
        # 15 decoding ranks wait (step - d) each, the prefilling rank none.
        assert row["idle_share"] == pytest.approx(15 * (step - d) / (16 * step), abs=1e-4)
    assert c["kv"]["per_engine_tokens"] == 16 * c["kv"]["per_rank_tokens"]
    r = CliRunner().invoke(app, ["sim", "calibrate", "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert set(rep["profiles"]) == {"qwen3-235b", "deepseek-v3.2", "mimo-v2.5-pro"}
    figs = {p["figure"]: p for p in rep["published"] if p["model"] == "deepseek-v3.2"}
    assert figs["prefill per node"]["published"] == 52_300.0
    assert figs["prefill per node"]["sim"] == rep["profiles"]["deepseek-v3.2"]["prefill"]["per_node_tok_s"]
    assert CliRunner().invoke(app, ["sim", "calibrate", "--models", "gpt-9"]).exit_code == 2


def test_paper_report_small_cli_json_and_resume(tmp_path):
    args = ["sim", "paper", "--models", "deepseek-v3.2", "--workloads", "general", "--staleness", "0",
            "--seeds", "0", "--steps", "2", "--grid", "2", "--batch-size", "16", "--gpus", "64", "--jobs", "1",
            "--out", str(tmp_path), "--json"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["meta"]["steps"] == 2 and rep["meta"]["seeds"] == [0] and not rep["meta"]["quick"]
    (entry,) = rep["settings"]
    assert entry["pd_policy"].startswith("static:") and len(entry["best_ratio_per_seed"]) == 1
    figs = {(f["section"], f["figure"]): f for f in rep["figures"]}
    co = figs[("Table 2", "trajectory time, colocation (s)")]
    assert co["paper"] == 713.05 and co["sim"] == entry["colocation"]["mean_trajectory_s"]["mean"]
    assert co["within"] == (0.9 * 713.05 <= co["sim"] <= 1.1 * 713.05)
    idle = figs[("Fig. 6 (DeepSeek-V3.2)", "colocation GPU idle ratio")]
    assert idle["band"] == [0.3621, 0.5998] and idle["status"] == "check"
    sp = [f for f in rep["figures"] if f["section"] == "Fig. 5 (DeepSeek-V3.2)"][0]
    assert sp["sim"] == pytest.approx(entry["speedup"]["mean"], abs=1e-4)
    assert any(b["bar"] == "PD >= 2x colocation" for b in rep["must_show"])
    # A sync setting's ceiling: colocation's step over its floor, never below what the
    # best split reached.
    (ceil,) = [f for f in rep["figures"] if f["figure"].startswith("the highest speedup any P:D split")]
    assert ceil["sim"] == entry["speedup_ceiling"]["mean"] >= entry["speedup"]["mean"]
    assert ceil["sim"] == pytest.approx(entry["colocation"]["rollout_time_s"]["mean"] / entry["floor_s"]["mean"], rel=1e-3)
    assert set(entry["phases"]["pd"]) == {"mean", "step_tail"}
    assert (tmp_path / "report.md").read_text().startswith("# Simulator vs paper")
    runs = sorted(p.name for p in (tmp_path / "runs").glob("*.json"))
    assert len(runs) == 3  # colocation + 2 static ratios
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0 and json.loads(again.stdout)["figures"] == rep["figures"]
    assert sorted(p.name for p in (tmp_path / "runs").glob("*.json")) == runs
    bad = CliRunner().invoke(app, ["sim", "paper", "--workloads", "chess", "--out", str(tmp_path)])
    assert bad.exit_code == 2 and "unknown workload" in bad.output
    # Under the gateway's rule on every DP rank: the same settings, simulated again (the
    # routing is part of each run's cache key) and named in the report.
    assert rep["meta"]["dp_routing"] == "load" and rep["meta"]["router_policy"] == "queue"
    smg = CliRunner().invoke(app, [*args, "--dp-routing", "prefix", "--router-policy", "smg"])
    assert smg.exit_code == 0, smg.output
    meta = json.loads(smg.stdout)["meta"]
    assert meta["dp_routing"] == "prefix" and meta["router_policy"] == "smg"
    assert len(list((tmp_path / "runs").glob("*.json"))) == 2 * len(runs)
    bad = CliRunner().invoke(app, [*args, "--router-policy", "rr"])
    assert bad.exit_code == 2 and "unknown router policy" in bad.output


def test_sim_run_writes_the_ideal_split_png(tmp_path):
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["sim", "run", "--workload", "math", "--model", "qwen3-235b", "--policy", "colocation",
                                 "--steps", "2", "--batch-size", "16", "--gpus", "16", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert (out / "ideal_split.png").read_bytes()[:4] == b"\x89PNG"
    s = json.loads((out / "summary.json").read_text())
    assert s["ideal_split"]["budget_engines"] == 4 and s["ideal_split"]["per_step"]
    tl = json.loads((out / "timeline.json").read_text())
    assert {"prefill_need", "decode_need_kv", "decode_need_step", "ideal_prefill", "step"} <= set(tl[0])
