"""``python -m prorsa_sim.emulated engine|router ...``: serve an emulated SGLang instance
or router over HTTP (uvicorn). The engine accepts SGLang's launch flags, so the engine
agent's launch command runs against it unchanged except for the module name."""

from __future__ import annotations

import argparse
import sys

from .engine import EngineOptions


def engine_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m prorsa_sim.emulated engine")
    p.add_argument("--model-path", default="emulated/model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--disaggregation-mode", choices=["null", "prefill", "decode"], default="null")
    p.add_argument("--disaggregation-transfer-backend", default="mooncake")
    p.add_argument("--disaggregation-bootstrap-port", type=int, default=8998)
    p.add_argument("--enable-pd-role-switch", action="store_true")
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--dp-size", type=int, default=1)
    p.add_argument("--ep-size", type=int, default=1)
    p.add_argument("--pp-size", type=int, default=1)
    p.add_argument("--max-total-tokens", dest="max_total_num_tokens", type=int, default=200_000)
    p.add_argument("--max-running-requests", type=int, default=256)
    g = p.add_argument_group("emulation (not SGLang flags)")
    g.add_argument("--speed", type=float, default=1.0, help="emulated seconds per wall second")
    g.add_argument("--startup-seconds", type=float, default=0.0, help="emulated model load time")
    g.add_argument("--switch-seconds", type=float, default=2.0, help="emulated in-place switch time")
    g.add_argument("--fail-switch", action="store_true", help="every in-place switch fails")
    return p


def engine_options(argv: list[str]) -> EngineOptions:
    """Parse engine flags; SGLang flags the emulator does not model are accepted and ignored."""
    args, _unknown = engine_parser().parse_known_args(argv)
    if args.speed <= 0:
        raise SystemExit("--speed must be > 0")
    return EngineOptions(**vars(args))


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("engine", "router"):
        raise SystemExit("usage: python -m prorsa_sim.emulated engine|router [options]")
    kind, rest = argv[0], argv[1:]
    if kind == "engine":
        from .server import create_engine_app

        opts = engine_options(rest)
        app = create_engine_app(opts)
        host, port = opts.host, opts.port
    else:
        from .router import create_router_app

        p = argparse.ArgumentParser(prog="python -m prorsa_sim.emulated router")
        p.add_argument("--host", default="127.0.0.1")
        p.add_argument("--port", type=int, default=30080)
        p.add_argument("--health-interval", type=float, default=1.0)
        a = p.parse_args(rest)
        app = create_router_app(health_interval_s=a.health_interval)
        host, port = a.host, a.port
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
