"""``run.started`` and ``policy.updated`` from verl's trainer process. No verl import here.

:func:`watch_trainer` is the hook: call it on verl's trainer once its workers exist (the
V1 ``PPOTrainer`` after ``init()``, the legacy ``RayPPOTrainer`` after ``init_workers()``).
The agent-loop managers (made in the same process) publish ``run.started`` from the config
too; whichever comes first publishes it, once, and both use one session (one run name)."""

from __future__ import annotations

import functools
import inspect
from typing import Any

from .session import Session, config_get

_DRIVER: list[Session] = []
"""The session that published this process's ``run.started`` (at most one)."""



def run_started_fields(config: Any) -> dict[str, Any]:
    """``run.started`` of a verl config: ``sync`` for verl's synchronous trainer, else
    ``async``; the batch is ``data.train_batch_size`` prompts of ``rollout.n`` samples each."""
    mode = config_get(config, "trainer", "v1", "trainer_mode") if config_get(config, "trainer", "use_v1") else "sync"
    fields: dict[str, Any] = {"mode": "sync" if mode in (None, "sync") else "async",
                              "batch_size": int(config_get(config, "data", "train_batch_size"))}
    n = config_get(config, "actor_rollout_ref", "rollout", "n")
    if n:
        fields["group_size"] = int(n)
    if fields["mode"] == "async":
        fields["injection"] = "group"
    return fields


def publish_run_started(config: Any, session: Session | None = None) -> Session:
    """``run.started`` for this run, once per process; returns the session that published it
    (``session``, else the environment's: ``$PRORSA_RUN``, ``$PRORSA_NATS_URL``)."""
    if _DRIVER:
        return _DRIVER[0]
    session = session or Session(default_run=str(config_get(config, "trainer", "experiment_name") or "verl"))
    fields = run_started_fields(config)
    session.emitter.run_started(fields.pop("mode"), fields.pop("batch_size"), **fields)
    _DRIVER.append(session)
    return session


def watch_trainer(trainer: Any, session: Session | None = None) -> Session:
    """``run.started`` (unless published already) and, after each
    ``trainer.checkpoint_manager.update_weights(global_steps)``, ``policy.updated`` with that
    version: the weights are on the rollout engines when the call returns."""
    manager = getattr(trainer, "checkpoint_manager", None)
    if manager is None or not callable(getattr(manager, "update_weights", None)):
        raise ValueError("watch_trainer needs the trainer's checkpoint_manager: call it after the trainer's "
                         "init() (V1 PPOTrainer) or init_workers() (RayPPOTrainer)")
    s = publish_run_started(trainer.config, session)
    update = manager.update_weights

    def published(version: Any) -> None:
        if isinstance(version, int) and not isinstance(version, bool) and version >= 0:
            s.emitter.policy_updated(version)

    @functools.wraps(update)
    def update_weights(*args: Any, **kwargs: Any) -> Any:
        version = kwargs.get("global_steps", args[0] if args else None)
        out = update(*args, **kwargs)
        if inspect.isawaitable(out):
            async def awaited() -> Any:
                r = await out
                published(version)
                return r
            return awaited()
        published(version)
        return out

    manager.update_weights = update_weights
    return s


def reset() -> None:
    """Forget this process's session (a new run in the same process)."""
    _DRIVER.clear()


__all__ = ["publish_run_started", "reset", "run_started_fields", "watch_trainer"]
