"""Console endpoint latency (median of 5) on the demo run with N trajectories, in SQLite:
`.venv/bin/python services/tracker/benchmarks/bench_console.py 2000`."""
import sys, tempfile, time
from pathlib import Path
from fastapi.testclient import TestClient
from prorsa_schemas import LogWriter
from prorsa_tracker.api import create_app
from prorsa_tracker.console_demo import demo_events
from prorsa_tracker.db import make_engine, migrate
from prorsa_tracker.tools import load
n = int(sys.argv[1])
d = Path(tempfile.mkdtemp()); log = d / "d.jsonl"
evs = demo_events(n_traj=n)
with LogWriter(log) as w:
    for e in evs: w.write(e)
url = f"sqlite:///{d}/d.db"; eng = make_engine(url); migrate(eng); load(eng, log)
c = TestClient(create_app(url, "t")); h = {"Authorization": "Bearer t"}
print(f"{len(evs)} events, {n} trajectories")
for p in ["/console/api/runs", "/console/api/runs/demo", "/console/api/runs/demo/windows", "/console/api/runs/demo/engines",
          "/console/api/runs/demo/switches", "/console/api/runs/demo/trajectories/t3", "/v1/runs/demo/trajectories?limit=50"]:
    ts = []
    for _ in range(5):
        t = time.perf_counter(); r = c.get(p, headers=h); ts.append(time.perf_counter() - t); assert r.status_code == 200, (p, r.text)
    ts.sort(); print(f"{p:50s} median {ts[2]*1000:7.1f} ms")
