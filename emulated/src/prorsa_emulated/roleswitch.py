"""``POST /pd_role_switch`` on an emulated instance, as SGLang 0.5.23 answers it.

The switch is refused unless ``--enable-pd-role-switch`` is set, the instance runs in PD
mode, the transfer backend supports it (mooncake, mori), no switch is in progress, no
earlier switch failed, and the instance is fully idle; ``safe_to_restore`` follows
``disaggregation/role_switch.py``. A failed teardown/rebuild (``--fail-switch``) leaves the
instance unhealthy ("restart required").
"""

from __future__ import annotations

import logging

from .engine import EmulatedEngine
from .options import SWITCH_BACKENDS

log = logging.getLogger("prorsa.emulated")


async def role_switch(eng: EmulatedEngine, new_role: str, graph_gb: float | None) -> tuple[int, dict]:
    """``POST /pd_role_switch``: (HTTP status, body) as SGLang 0.5.23 answers."""
    old = eng.mode

    def out(success: bool, message: str, safe: bool = False) -> tuple[int, dict]:
        body = {
            "rid": None, "http_worker_ipc": None, "success": success, "message": message,
            "old_role": old, "new_role": new_role, "safe_to_restore": safe,
        }
        return (200 if success else 400), body

    if not eng.opt.enable_pd_role_switch:
        return out(False, "--enable-pd-role-switch is not set on this server", True)
    if eng.unhealthy:
        return out(False, "instance is unhealthy after a failed role switch; restart required")
    if eng.switch_in_progress:
        return out(False, "another role switch is already in progress")
    if new_role not in ("prefill", "decode"):
        return out(False, f"invalid new_role={new_role!r}", True)
    if eng.mode == "null":
        return out(False, "instance is not running in PD disaggregation mode", True)
    if eng.opt.disaggregation_transfer_backend not in SWITCH_BACKENDS:
        return out(False, f"transfer backend {eng.opt.disaggregation_transfer_backend!r} "
                   "does not support runtime role switch", True)
    if new_role == old:
        return out(True, "already in target role")
    if not eng.is_fully_idle():
        return out(False, "instance is not idle; drain all requests before switching", True)
    if graph_gb is not None and not graph_gb >= 0:  # NaN too
        return out(False, "decode_cuda_graph_memory_gb must be non-negative", True)
    eng.switch_in_progress = True
    try:
        await eng.sleep(eng.opt.switch_seconds)
        if eng.opt.fail_switch:
            eng.unhealthy = True
            return out(False, "role switch failed; instance unhealthy, restart required: "
                       "emulated teardown failure")
        eng.mode = new_role  # type: ignore[assignment]
        for r in eng.ranks:  # the KV pool is rebuilt for the new role
            r.cache.clear()
        eng.switches += 1
        try:
            await eng.serve_bootstrap()
        except OSError as exc:  # its decode peers' transfers fail (abort) until fixed
            log.error("bootstrap port %s: %s", eng.opt.disaggregation_bootstrap_port, exc)
        return out(True, "ok")
    finally:
        eng.switch_in_progress = False
