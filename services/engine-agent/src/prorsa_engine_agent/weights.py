"""Which weights an engine serves, and whether a weight update is in progress (pure).

SGLang 0.5.23 reports an engine's weights in ``GET /model_info``: ``model_path`` (moved by
``POST /update_weights_from_disk {model_path, weight_version}``) and ``weight_version``
(``--weight-version`` at launch, default ``"default"``; set by the update calls that pass
one, or by ``/update_weight_version``). The bus reports ``policy.updated {version}`` once new
weights reached the engines (optional ``model_path``: where they were loaded from).

A restart-mode switch relaunches the engine with ``--model-path P --weight-version W``. What
P and W are is decided here, from what the agent launched the engine with, what the engine
reports and the latest policy update; when they cannot be known the switch is refused.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Weights:
    """Weights an engine was launched with (journaled per engine)."""

    model_path: str
    weight_version: str = "default"
    since: float = 0.0
    """When the engine got them (epoch seconds): a policy update older than this is in them."""

    def to_json(self) -> dict:
        return {"model_path": self.model_path, "weight_version": self.weight_version, "since": self.since}

    @classmethod
    def from_json(cls, d: dict) -> "Weights":
        return cls(str(d["model_path"]), str(d.get("weight_version", "default")), float(d.get("since", 0.0)))


@dataclass(frozen=True)
class Policy:
    """The latest ``policy.updated`` the agent has read."""

    version: int
    ts: float
    model_path: str | None = None


@dataclass(frozen=True)
class Reported:
    """What the engine says it serves (``/model_info``)."""

    model_path: str
    weight_version: str


@dataclass(frozen=True)
class Resolved:
    """The weights to relaunch with, or why they cannot be known (``weights`` is None)."""

    weights: Weights | None
    reason: str = ""


def _int(v: str) -> int | None:
    return int(v) if v.isdigit() else None


def update_in_progress(reported: Reported | None, ready: bool | None, policy: Policy | None) -> str:
    """Why a weight update is in progress on the engine ("" when none is seen).

    Two signs: the engine is healthy but not ready (``GET /ready`` 503: generation paused,
    which is how RL frameworks bracket a weight sync: pause_generation, update_weights_*,
    continue_generation); or it reports a numeric weight version older than the latest
    ``policy.updated`` (the update has not reached it yet).
    """
    if ready is False:
        return "generation is paused (GET /ready answers 503): a weight update is in progress"
    if reported is not None and policy is not None:
        v = _int(reported.weight_version)
        if v is not None and v < policy.version:
            return (f"the engine reports weight_version {v} but policy.updated says version "
                    f"{policy.version}: its weight update has not finished")
    return ""


def resolve(launched: Weights, reported: Reported | None, policy: Policy | None,
            template: str | None, now: float) -> Resolved:
    """The weights a relaunch must load so that the engine comes back on what it serves now.

    Args:
        launched: what the agent launched the engine with.
        reported: what the engine reports now (None: it does not answer).
        policy: the latest policy update read from the bus, if any.
        template: the instance's ``weights_path`` (``{version}`` in it), if set.
        now: the time the resolved weights are stamped with.
    """
    moved = policy is not None and policy.ts > launched.since  # an update since the launch

    def from_policy(why: str) -> Resolved:
        assert policy is not None
        if policy.model_path:
            return Resolved(Weights(policy.model_path, str(policy.version), now))
        if template:
            return Resolved(Weights(template.format(version=policy.version), str(policy.version), now))
        return Resolved(None, why + "; set weights_path on the instance (a path with {version}), or "
                        "have the framework pass model_path in policy.updated or weight_version "
                        "in its update call")

    if reported is None:
        if moved:
            return from_policy(f"the engine does not answer and policy version {policy.version} "
                               "arrived after its launch: its weights are unknown")
        return Resolved(launched)
    if reported.model_path != launched.model_path:
        # update_weights_from_disk moved it: the engine loaded these files.
        return Resolved(Weights(reported.model_path, reported.weight_version, now))
    if reported.weight_version != launched.weight_version:
        v = _int(reported.weight_version)
        if policy is not None and policy.model_path and v == policy.version:
            return Resolved(Weights(policy.model_path, reported.weight_version, now))
        if template:
            return Resolved(Weights(template.format(version=reported.weight_version),
                                    reported.weight_version, now))
        return Resolved(None, f"the engine reports weight_version {reported.weight_version!r} (launched "
                        f"with {launched.weight_version!r}) at the same model_path {reported.model_path}: "
                        "the new weights may live in memory only (update_weights_from_distributed/"
                        "tensor) and a relaunch would load the old ones; set weights_path on the "
                        "instance (a path with {version})")
    if moved:
        return from_policy(f"policy version {policy.version} arrived after the engine's launch but it "
                           f"still reports its launch weights ({reported.model_path}, weight_version "
                           f"{reported.weight_version!r}): it may serve weights updated in memory "
                           "without a version")
    return Resolved(Weights(launched.model_path, launched.weight_version, launched.since))
