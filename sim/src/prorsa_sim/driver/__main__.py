"""``python -m prorsa_sim.driver``: run the rollout driver against a router and a bus."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from pydantic import ValidationError

from .config import DriverConfig


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m prorsa_sim.driver",
                                description="Simulated agentic rollout against a live Prorsa stack.")
    p.add_argument("--router", dest="router_url", required=True, help="router base URL")
    p.add_argument("--nats", dest="nats_url", default="nats://127.0.0.1:4222")
    for name, typ in (("run", str), ("workload", str), ("batch-size", int), ("steps", int),
                      ("max-turns", int), ("max-output", int), ("speed", float), ("train-s", float),
                      ("seed", int), ("prefix", str), ("stream", str), ("out", Path), ("progress", Path),
                      ("ready-timeout-s", float), ("staleness", int), ("over-dispatch", float),
                      ("weight-sync-s", float), ("pause-mode", str)):
        p.add_argument(f"--{name}", type=typ, default=None)
    return p


def main(argv: list[str] | None = None) -> int:
    args = vars(parser().parse_args(argv))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s driver %(levelname)s %(message)s")
    try:
        cfg = DriverConfig(**{k: v for k, v in args.items() if v is not None})
    except ValidationError as exc:
        print(f"error: invalid driver settings: {exc}", file=sys.stderr)
        return 2
    from .loop import RouterRefused, run_driver

    try:
        result = asyncio.run(run_driver(cfg))
    except (TimeoutError, ConnectionError, RouterRefused) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(result.to_json())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
