"""``runner.run_matrix``: several settings x seeds x policies through the cached parallel
jobs, with the common start, extra fixed ratios, a policy on fewer seeds, and cache keys
that follow the code each policy depends on."""

import json
from dataclasses import replace

from prorsa_sim.compare import Setting, run_matrix
from prorsa_sim.runner import CodeVersions, Job, code_version, code_versions
from prorsa_sim.simconfig import SimConfig

TINY = SimConfig(workload="general", model="qwen3-235b", staleness=2, steps=2, batch_size=8, total_gpus=16)
POLICIES = ["colocation", "static", "reactive", "prorsa"]
BOUND = "bound:60:beam=1"


def test_settings_seeds_extra_statics_fewer_seeds_and_the_cache(tmp_path):
    # The bound on the first setting only (its own policy), and there on seed 0 only.
    settings = [Setting(TINY, statics=("static:2:2",), policies=(BOUND,)), Setting(replace(TINY, staleness=0))]
    seen: list[Job] = []
    total: list[int] = []
    m = run_matrix(settings, POLICIES, [0, 1], n_jobs=1, grid=2, cache_dir=tmp_path, progress=seen.append,
                   on_total=total.append, seeds_for={BOUND: [0]})
    # Phase 1: colocation + the 2-point grid (1:3, 3:1) + 2:2 on the first setting; phase 2:
    # reactive and prorsa on both seeds; phase 3: the bound on seed 0 of the first setting
    # only, handed that seed's reactive and prorsa runs (the grid's 2 points are not every
    # ratio, so it runs its own sweep).
    assert total == [2 * (1 + 3) + 2 * (1 + 2) + 2 * 2 * 2 + 1] == [len(seen)]
    assert seen[-1].spec == BOUND
    assert [name for name, *_ in seen[-1].seeds] == ["reactive", "prorsa"]
    assert set(seen[-1].seeds[0][2]) == {tuple(r) for r in m.runs[(0, 0, "reactive")]["switch_requests"]}
    assert set(m.runs[(0, 0, BOUND)]["bound_search"]["seeds"]) == {"reactive", "prorsa"}
    assert m.runs[(0, 0, BOUND)]["rollout_time_s"] <= min(m.runs[(0, 0, p)]["rollout_time_s"]
                                                          for p in ("reactive", "prorsa"))
    for i, setting in enumerate(settings):
        for s in (0, 1):
            spec, summ, tried = m.best[(i, s)]
            ratios = {"static:1:3", "static:3:1"} | ({"static:2:2"} if i == 0 else set())
            assert set(tried) == ratios and tried[spec] == min(tried.values())
            p, d = spec.split(":")[1:]
            for pol in ("reactive", "prorsa"):
                assert m.runs[(i, s, pol)]["start"] == f"{p}:{d}"
                assert m.runs[(i, s, pol)]["seed"] == s
        assert (i, 1, BOUND) not in m.runs
    assert m.runs[(0, 0, BOUND)]["start"] is None  # the bound chooses its own start
    assert (1, 0, BOUND) not in m.runs and BOUND not in {r["spec"] for r in m.rows(1)}
    rows = {r["spec"]: r for r in m.rows(0)}
    assert rows[BOUND]["seeds"] == [0] and len(rows[BOUND]["per_seed"]) == 1
    assert rows["reactive"]["seeds"] == [0, 1]
    co = rows["colocation"]["per_seed"][0]["rollout_time_s"]
    b = rows[BOUND]["per_seed"][0]["rollout_time_s"]
    assert rows[BOUND]["speedup_per_seed"] == [round(co / b, 4)]
    assert rows["static"]["best_ratio_per_seed"] == [m.best[(0, s)][0][len("static:"):] for s in (0, 1)]
    # The bound's own (full) sweep agrees with the matrix's runs of the same ratios.
    bs = rows[BOUND]["per_seed"][0]["bound_search"]["static_sweep"]
    assert all(bs[k] == v for k, v in m.best[(0, 0)][2].items() if k in bs)

    # Cache keys: the allocator's policies also hash the allocator and the forecaster.
    files = {json.loads(f.read_text())["job"]["spec"]: f for f in (tmp_path / "runs").glob("*seed0*.json")}
    docs = {spec: json.loads(f.read_text()) for spec, f in files.items()}
    assert "+" in docs["prorsa"]["code_version"] and "+" not in docs["reactive"]["code_version"]
    assert docs["prorsa"]["code_version"] == code_version("prorsa")
    assert docs["reactive"]["code_version"] == code_version() == code_version("bound")
    # The fixed ratios load no policy module: an edit there does not re-run the sweep.
    assert docs["static:1:3"]["code_version"] == code_version("colocation") != code_version()

    # A rerun reads every result back: mark one and see the mark.
    f = files["prorsa"]
    doc = json.loads(f.read_text())
    doc["summary"]["marker"] = "from-cache"
    f.write_text(json.dumps(doc))
    again = run_matrix(settings, POLICIES, [0, 1], n_jobs=1, grid=2, cache_dir=tmp_path,
                       seeds_for={BOUND: [0]})
    assert sum(s.get("marker") == "from-cache" for s in again.runs.values()) == 1
    # A changed allocator version re-keys the prorsa runs only.
    v = code_versions()
    other = CodeVersions(v.fixed, v.sim, "0" * 12)
    assert other(Job(TINY, "prorsa:paper")) != v(Job(TINY, "prorsa:paper"))
    assert other(Job(TINY, "reactive")) == v(Job(TINY, "reactive")) == str(v)
    assert v(Job(TINY, "static:1:3")) == v.fixed
