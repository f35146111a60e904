"""The asynchronous RL sampler's rules, shared by the simulator (``trajectories``) and the
live rollout driver (``driver.loop``), so that both dispatch, train and drop alike.

AReaL-style: up to ``over_dispatch`` batches live at once (CHOICE, default 1 + staleness /
4: a looser bound lets the sampler run further ahead); never more than (version +
staleness + 1) batches launched, over-dispatched by 1 / admission rate so that enough
samples are admitted; a GRPO group dispatched whole (a started group is completed past the
bounds); the trainer starts once a batch of admitted rewards per version is in; at an
update, a trajectory more than ``staleness`` versions old is dropped.
"""

from __future__ import annotations

import math


def live_cap(batch_size: int, staleness: int, over_dispatch: float | None = None) -> int:
    """Trajectories live at once at most."""
    over = over_dispatch if over_dispatch is not None else 1 + staleness / 4
    return int(batch_size * over)


def launch_budget(version: int, staleness: int, batch_size: int, admission_rate: float) -> int:
    """Trajectories launched in all, at most, while the policy is at ``version``."""
    return math.ceil((version + staleness + 1) * batch_size / admission_rate)


def may_dispatch(live: int, launched: int, cap: int, budget: int, group_size: int) -> bool:
    """Whether the next trajectory (index ``launched``) is dispatched now."""
    return (live < cap and launched < budget) or launched % group_size != 0


def trainer_ready(admitted: int, version: int, batch_size: int) -> bool:
    """Whether enough admitted rewards are in for the next update."""
    return admitted >= (version + 1) * batch_size


def is_stale(traj_version: int, version: int, staleness: int) -> bool:
    """Whether a trajectory dispatched under ``traj_version`` is past the bound at ``version``."""
    return traj_version < version - staleness
