"""The agent's process entry point (``prorsa engine-agent run``)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from prorsa_runtime.lifecycle import run_until_stopped
from prorsa_runtime.logs import setup_logging

from .config import ConfigError, load_config

log = logging.getLogger("prorsa.engine_agent")


def run_agent(config_path: Path, nats_url: str | None = None, stop_engines: bool = False) -> int:
    """Load the config and run until SIGINT/SIGTERM; returns the exit code."""
    from .agent import EngineAgent

    overrides = {"nats_url": nats_url} if nats_url else {}
    try:
        config = load_config(config_path, **overrides)
    except ConfigError as exc:
        print(f"error: {exc}")
        return 2
    setup_logging(config.settings.log_level, config.settings.log_json, service="engine-agent")
    for noisy in ("httpx", "httpcore"):  # one line per poll otherwise
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        agent = EngineAgent(config)
    except ValueError as exc:  # a corrupt journal
        print(f"error: {exc}")
        return 2

    if config.settings.metrics_port is not None:  # PRORSA_AGENT_METRICS_PORT
        from prorsa_runtime.metrics import serve_metrics

        def health() -> tuple[bool, dict]:
            up = sum(1 for st in agent.engines.values() if st.up)
            return up == len(config.instances), {"engines_up": up, "engines": len(config.instances)}

        try:
            serve_metrics(agent.metrics.registry(), config.settings.metrics_port, health)
        except OSError as exc:
            print(f"error: cannot serve metrics on port {config.settings.metrics_port}: {exc}")
            return 2

    async def main(stack, stop) -> None:
        try:
            await agent.run(stack, stop)
        finally:
            if stop_engines:
                await agent.stop_engines()

    asyncio.run(run_until_stopped(main, "engine-agent"))
    return 0
