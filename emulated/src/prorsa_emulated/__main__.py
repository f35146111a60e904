"""``python -m prorsa_emulated engine|router ...``: serve an emulated SGLang instance
or router over HTTP (uvicorn). The engine accepts SGLang's launch flags, so the engine
agent's launch command runs against it unchanged except for the module name."""

from __future__ import annotations

import argparse
import sys

from .options import EngineOptions
from .profiles import DEFAULT_MODEL, EMULATED_PROFILES


def engine_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m prorsa_emulated engine")
    p.add_argument("--model-path", default="emulated/model")
    p.add_argument("--weight-version", default="default")
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
    p.add_argument("--max-total-tokens", dest="max_total_num_tokens", type=int, default=None,
                   help="KV tokens (default: the emulated model's capacity)")
    p.add_argument("--max-running-requests", type=int, default=None,
                   help="requests the engine may run, split over its attention-DP ranks "
                        "(default: SGLang's, 2048 a rank or half its KV tokens)")
    p.add_argument("--chunked-prefill-size", type=int, default=None,
                   help="default: the emulated model's chunk size")
    g = p.add_argument_group("emulation (not SGLang flags)")
    g.add_argument("--emulated-model", default=DEFAULT_MODEL,
                   help=f"cost-model profile: {', '.join(sorted(EMULATED_PROFILES))} (default "
                        f"{DEFAULT_MODEL}); not --model, which SGLang reads as --model-path")
    g.add_argument("--emulated-dp-routing", choices=("load", "prefix"), default="load",
                   help="how a request's attention-DP rank is chosen, as the simulator's "
                        "dp_routing: load (SGLang's data-parallel controller; default) or "
                        "prefix (a DP-aware, cache-aware router)")
    g.add_argument("--speed", type=float, default=1.0, help="emulated seconds per wall second")
    g.add_argument("--startup-seconds", type=float, default=0.0, help="emulated model load time")
    g.add_argument("--switch-seconds", type=float, default=None,
                   help="emulated in-place switch time (default: the profile's)")
    g.add_argument("--fail-switch", action="store_true", help="every in-place switch fails")
    return p


def engine_options(argv: list[str]) -> EngineOptions:
    """Parse engine flags; SGLang flags the emulator does not model are accepted and ignored."""
    args, _unknown = engine_parser().parse_known_args(argv)
    if args.speed <= 0:
        raise SystemExit("--speed must be > 0")
    if args.emulated_model not in EMULATED_PROFILES:
        raise SystemExit(f"--emulated-model {args.emulated_model!r} unknown; choose one of: "
                         f"{', '.join(sorted(EMULATED_PROFILES))}")
    for flag in ("max_total_num_tokens", "chunked_prefill_size", "switch_seconds"):
        v = getattr(args, flag)
        if v is not None and v < (0 if flag == "switch_seconds" else 1):
            raise SystemExit(f"--{flag.replace('_', '-')} must be positive, got {v}")
    if args.max_running_requests is not None and args.max_running_requests < 1:
        raise SystemExit("--max-running-requests must be >= 1")
    return EngineOptions(**vars(args))


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("engine", "router"):
        raise SystemExit("usage: python -m prorsa_emulated engine|router [options]")
    kind, rest = argv[0], argv[1:]
    if kind == "engine":
        from .server import create_engine_app

        opts = engine_options(rest)
        opts.serve_bootstrap = True  # a server process listens on its bootstrap port
        app = create_engine_app(opts)
        host, port = opts.host, opts.port
    else:
        from .router import create_router_app

        p = argparse.ArgumentParser(prog="python -m prorsa_emulated router")
        p.add_argument("--host", default="127.0.0.1")
        p.add_argument("--port", type=int, default=30080)
        p.add_argument("--health-interval", type=float, default=1.0)
        a = p.parse_args(rest)
        app = create_router_app(health_interval_s=a.health_interval)
        host, port = a.host, a.port
    # A bounded graceful shutdown: open long polls (a decode peer waiting on a PD room, up
    # to 600 s) would otherwise hold the exit until its supervisor kills it.
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False,
                timeout_graceful_shutdown=2)


if __name__ == "__main__":
    main()
