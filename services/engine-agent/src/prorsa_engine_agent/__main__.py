"""``python -m prorsa_engine_agent --config FILE``: the agent without the `prorsa` CLI package,
so that the engine agent's image carries none of the tracker's dependencies."""

from __future__ import annotations

import argparse
from pathlib import Path

from .service import run_agent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m prorsa_engine_agent")
    p.add_argument("--config", "-c", type=Path, default=None, help="instances file (or PRORSA_AGENT_CONFIG)")
    p.add_argument("--nats", default=None, help="NATS URL (or PRORSA_NATS_URL)")
    p.add_argument("--stop-engines-on-exit", action="store_true")
    a = p.parse_args(argv)
    return run_agent(a.config, a.nats, a.stop_engines_on_exit)


if __name__ == "__main__":
    raise SystemExit(main())
