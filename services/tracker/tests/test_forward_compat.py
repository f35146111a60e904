"""Forward compatibility (docs/contract.md): fields an event type does not name are accepted,
kept by the tracker, and returned by `prorsa export` byte for byte; an event without ``v``
is rejected (an anomaly with its reason), never applied."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from sqlalchemy import select

from prorsa_runtime import connect, ensure_stream
from prorsa_runtime.testing import async_wait_until
from prorsa_schemas import decode_event
from prorsa_schemas.codec import unknown_fields
from prorsa_tracker.db import make_engine
from prorsa_tracker.models import AnomalyRow
from prorsa_tracker.service import Tracker
from prorsa_tracker.settings import TrackerSettings
from prorsa_tracker.tools import export

PRORSA = str(Path(sys.executable).with_name("prorsa"))
RUN = "fc-run"

# Raw bytes as a producer newer than these models might send them: unknown fields (top level,
# nested, null, unicode escapes), unusual key order and spacing, `1.50`-style numbers. A
# tracker that re-serialised an event would change every one of these lines.
EXTRA = [
    b'{"type":"run.started","v":1,"id":"fc-0","ts":0,"run":"fc-run","mode":"async","batch_size":4,'
    b'"framework":{"name":"verl","version":[0,4,1]}}',
    b'{"v": 1, "id": "fc-1", "type": "engine.registered", "ts": 0.50, "run": "fc-run", "engine": "e0", '
    b'"server": "s0", "role": "prefill", "gpus": 8, "kv_capacity_tokens": 1000000, '
    b'"parallel": {"tp": 8, "gpu_kind": "H200"}, "rack": "r7"}',
    b'{"v":1,"id":"fc-2","type":"trajectory.dispatched","ts":1.50,"run":"fc-run","traj":"t1",'
    b'"prompt_tokens":812,"colour":"r\\u00e9d","x_future":null}',
    b'{"v":1,"id":"fc-3","type":"request.queued","ts":2.0,"run":"fc-run","traj":"t1","req":"r1","turn":0,'
    b'"prompt_tokens":812,"engine":"e0","dp_rank":3,"priority":1e2}',
    b'{"v":1,"id":"fc-4","type":"prefill.finished","ts":3.25,"run":"fc-run","traj":"t1","req":"r1",'
    b'"cached_tokens":0,"kv_transfer_ms":12.000}',
    b'{"v":1,"id":"fc-5","type":"decode.finished","ts":4,"run":"fc-run","traj":"t1","req":"r1",'
    b'"output_tokens":90,"finish":"stop","logprobs_digest":"ab\\"cd"}',
    b'{"v":1,"id":"fc-6","type":"reward.finished","ts":5.5,"run":"fc-run","traj":"t1","admitted":true,'
    b'"reward":0.5,"judge":{"model":"rm-7b","scores":[0.25,0.75]}}',
]
NO_V = b'{"id":"fc-7","type":"policy.updated","ts":6,"run":"fc-run","version":2}'


async def _publish(nats_url: str, ns, raws: list[bytes]) -> None:
    nc = await connect(nats_url, "fc-pub")
    await ensure_stream(nc.jetstream(), ns)
    for raw in raws:
        obj = json.loads(raw)
        await nc.publish(ns.subject_for_type(obj["type"]), raw, headers={"Nats-Msg-Id": obj["id"]})
    await nc.flush()
    await nc.close()


async def test_extra_fields_round_trip_publish_tracker_export_byte_for_byte(nats_url, ns, tmp_path) -> None:
    for raw in EXTRA:  # valid under the models, each with fields the models do not name
        assert unknown_fields(decode_event(raw))
    await _publish(nats_url, ns, [*EXTRA, NO_V])
    db = f"sqlite:///{tmp_path}/fc.db"
    s = TrackerSettings(nats_url=nats_url, subject_prefix=ns.prefix, stream=ns.stream, db_url=db, clock="event")
    tracker, stop = Tracker(s), asyncio.Event()
    task = asyncio.create_task(tracker.run(stop))
    await async_wait_until(lambda: tracker.written >= len(EXTRA) + 1, timeout=60, what="ingest")
    stop.set()
    await task

    expected = b"".join(raw + b"\n" for raw in EXTRA)  # already in ts order
    # the export path (a file) ...
    out = tmp_path / "export.jsonl"
    n, n_ctx = export(make_engine(db), RUN, out)
    assert (n, n_ctx) == (len(EXTRA), 0)
    assert out.read_bytes() == expected
    # ... and the command (stdout)
    proc = subprocess.run([PRORSA, "export", "--run", RUN, "--db", db], capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout == expected

    # The event without `v` is no event: an anomaly with the reason, the message kept.
    eng = make_engine(db)
    with eng.connect() as c:
        rows = c.execute(select(AnomalyRow.raw, AnomalyRow.reason)).all()
    eng.dispose()
    assert [(bytes(r.raw), "field 'v': is required but missing" in r.reason) for r in rows] == [(NO_V, True)]
