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


def test_the_cache_key_covers_every_module_a_simulation_runs():
    # A fresh interpreter: the modules one simulation of each policy loads are the ones
    # the key hashes (the simulator's, its policies', the cost model, the router rule's),
    # and the harness (runner, compare, cli) is not among them.
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from prorsa_sim.simulation import simulate\n"
        "from prorsa_sim.simconfig import SimConfig\n"
        "cfg = SimConfig(workload='general', model='qwen3-235b', staleness=2, steps=1, batch_size=4, total_gpus=16,"
        " router_policy='smg', dp_routing='prefix')\n"
        "for spec in ('colocation', 'static:2:2', 'reactive', 'prorsa', 'oracle'):\n"
        "    simulate(cfg, spec)\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith(('prorsa_sim', 'prorsa_emulated.')))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    from prorsa_sim import runner

    keyed = set(runner._RESULT_MODULES) | {m for mods in runner._ROUTER_MODULES.values() for m in mods}
    keyed.add("policies")  # the package: its modules are hashed one by one (policies/*.py)
    sim_loaded = {m.split(".")[1] for m in out if m.startswith("prorsa_sim.")}
    # prorsa_emulated's package __init__ loads its server modules; the simulator uses two.
    emulated_used = {m.split(".")[1] for m in out if m.startswith("prorsa_emulated.")} - {
        "cluster", "engine", "options", "pd", "prefix_cache", "profiles", "scheduler", "timing"}
    assert sim_loaded <= keyed, sim_loaded - keyed
    assert emulated_used == {"costmodel", "smg"} and emulated_used <= keyed
    assert "runner" not in sim_loaded and "compare" not in sim_loaded


def test_the_allocator_key_covers_the_forecaster_terms_and_the_router_rule_keys_its_runs_only():
    from prorsa_sim import runner

    names = {f.relative_to(f.parents[1]).as_posix() for f in runner._allocator_files()}
    assert {"terms/decode_admit.py", "terms/correction.py", "prorsa_forecaster/core.py",
            "prorsa_allocator/planner.py"} <= names
    assert not any(n.endswith(("cli.py", "service.py")) for n in names)
    v = code_versions()
    smg = replace(TINY, router_policy="smg", dp_routing="prefix")
    for spec in ("static:1:3", "reactive", "prorsa"):
        assert v(Job(TINY, spec)) == code_version(spec)
        assert v(Job(smg, spec)) == code_version(spec, "smg") == f"{v(Job(TINY, spec))}+smg{runner.router_version('smg')}"
    assert runner.router_version("queue") == ""


def test_a_setting_s_own_start_overrides_the_sweep_s(tmp_path):
    # The first setting starts its switching policies from 2:2 (e.g. the paper's ratio for
    # its workload), which the 2-point grid (1:3, 3:1) cannot pick; the second from its
    # seed's best static ratio, as the sweep says.
    settings = [Setting(TINY, start=(2, 2)), Setting(replace(TINY, staleness=0))]
    m = run_matrix(settings, ["static", "reactive"], [0], n_jobs=1, grid=2, cache_dir=tmp_path)
    assert m.runs[(0, 0, "reactive")]["start"] == "2:2"
    best = m.best[(1, 0)][0][len("static:"):]
    assert m.runs[(1, 0, "reactive")]["start"] == best
    # Without the static column, a setting with its own start needs no sweep at all.
    m2 = run_matrix([Setting(TINY, start=(3, 1))], ["reactive"], [0], n_jobs=1, grid=2, cache_dir=tmp_path)
    assert set(m2.runs) == {(0, 0, "reactive")} and m2.runs[(0, 0, "reactive")]["start"] == "3:1"
