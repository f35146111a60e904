"""benchmarks/prefix_working_set.py on a hand-built log: the live prefixes' total (W), the
prefill pool's cache capacity (C) and the computed share, from the second weight update on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from prorsa_schemas import (
    EngineRegistered, EngineSwitched, PolicyUpdated, PrefillFinished, RequestQueued, RewardFinished,
    TrajectoryDispatched,
)
from prorsa_schemas.codec import encode_event

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "prefix_working_set.py"
RUN = "r"
M = 100_000  # tokens per unit of the hand computation


def test_working_set_capacity_and_computed_share_by_hand(tmp_path: Path) -> None:
    evs = [
        EngineRegistered(id="e1", ts=0.0, run=RUN, engine="p0", server="s", role="prefill", gpus=8,
                         kv_capacity_tokens=100 * M),
        EngineRegistered(id="e2", ts=0.0, run=RUN, engine="d0", server="s", role="decode", gpus=8,
                         kv_capacity_tokens=100 * M),
        PolicyUpdated(id="u1", ts=1.0, run=RUN, version=1),
        PolicyUpdated(id="u2", ts=2.0, run=RUN, version=2),
        TrajectoryDispatched(id="t1", ts=3.0, run=RUN, traj="A", prompt_tokens=40 * M),
        TrajectoryDispatched(id="t2", ts=3.0, run=RUN, traj="B", prompt_tokens=50 * M),
        RequestQueued(id="q1", ts=4.0, run=RUN, traj="A", req="a1", turn=0, prompt_tokens=60 * M),   # W 60
        RequestQueued(id="q2", ts=5.0, run=RUN, traj="B", req="b1", turn=0, prompt_tokens=50 * M),   # W 110
        PrefillFinished(id="f1", ts=6.0, run=RUN, traj="A", req="a1", cached_tokens=30 * M),
        PrefillFinished(id="f2", ts=7.0, run=RUN, traj="B", req="b1", cached_tokens=0),
        RewardFinished(id="r1", ts=8.0, run=RUN, traj="A", admitted=True),                     # W 50
        EngineSwitched(id="s1", ts=9.0, run=RUN, engine="d0", cmd="c", from_role="decode", to_role="prefill",
                       seconds=5.0),                                                           # C 200
    ]
    log = tmp_path / "events.jsonl"
    log.write_bytes(b"\n".join(encode_event(e) for e in evs) + b"\n{not json\n")
    out = subprocess.run([sys.executable, str(SCRIPT), str(log), "--bucket", "100"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    # W samples 60, 110, 50, 50 (mean 67.5); C 100, 100, 100, 200 (mean 125); computed 1 - 30/110.
    assert "W 6.75M tokens, C 12.50M, W/C 0.54, computed 72.7% of the prompt tokens" in out.stdout
    # The one bucket of 100 s holds the same samples (none comes before the second update).
    assert "       0       6.75      12.50   0.54     72.7%" in out.stdout
    assert "1 line(s) are not contract events" in out.stderr


def test_a_missing_log_is_a_clear_error(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "nope.jsonl")], capture_output=True, text=True)
    assert out.returncode == 1 and "cannot read" in out.stderr
