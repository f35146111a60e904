"""The SDK installs with plain pip: the wheels of prorsa-sdk, prorsa-runtime and
prorsa-schemas (built by ``uv build``) go into an empty ``python3 -m venv`` with their
third-party dependencies from PyPI, without SQLAlchemy, FastAPI or any service; a script
run in that venv publishes an event that the tracker stores."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("prorsa-schemas", "prorsa-runtime", "prorsa-sdk")

SCRIPT = """
import asyncio, importlib.metadata as md, json, sys
from prorsa_schemas import Namespace
import prorsa_sdk
from prorsa_sdk import Emitter

async def main(url, prefix, stream):
    async with Emitter("pip-run", url, namespace=Namespace(prefix=prefix, stream=stream)) as em:
        ev = await em.dispatched("pip-t1", 42)
        await em.flush()
    dists = sorted(d.metadata["Name"].lower() for d in md.distributions())
    print(json.dumps({"id": ev.id, "version": prorsa_sdk.__version__, "dist": md.version("prorsa-sdk"),
                      "dists": dists}))

asyncio.run(main(*sys.argv[1:]))
"""


def _uv() -> str:
    local = ROOT / ".tools" / "bin" / "uv"
    found = str(local) if local.exists() else shutil.which("uv")
    if not found:
        pytest.fail("uv is needed to build the wheels (scripts/bootstrap installs it into .tools/)")
    return found


def _run(cmd: list[str], **kw) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    assert r.returncode == 0, f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


@pytest.mark.slow
async def test_wheels_install_with_pip_into_an_empty_venv_and_publish(nats_url, ns, tracker, tmp_path):
    dist = tmp_path / "dist"
    for package in PACKAGES:
        _run([_uv(), "build", "--package", package, "--wheel", "--out-dir", str(dist)], cwd=ROOT)
    wheels = sorted(dist.glob("*.whl"))
    assert [w.name.split("-")[1] for w in wheels] == ["0.1.0"] * 3  # one version for all three

    venv = tmp_path / "venv"
    python = shutil.which("python3") or sys.executable
    _run([python, "-m", "venv", str(venv)])
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    _run([str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", *map(str, wheels)], env=env)
    out = _run([str(venv / "bin" / "python"), "-c", SCRIPT, nats_url, ns.prefix, ns.stream], env=env, cwd=tmp_path)
    report = json.loads(out.strip().splitlines()[-1])

    assert report["version"] == report["dist"] == "0.1.0"
    dists = set(report["dists"])
    assert {"prorsa-sdk", "prorsa-runtime", "prorsa-schemas", "nats-py", "httpx", "pydantic"} <= dists
    heavy = {"sqlalchemy", "fastapi", "uvicorn", "numpy", "prorsa-tracker", "prorsa-sim", "prorsa"} & dists
    assert not heavy, f"the SDK pulled in {heavy}"
    await tracker.wait_events(1)
    assert [e.id for e in tracker.events()] == [report["id"]]
    assert tracker.events()[0].traj == "pip-t1" and tracker.anomalies() == []
