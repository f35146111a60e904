"""A piecewise-constant P:D schedule and how it is applied: the policy the ``bound``
search's forks run and its reported run replays (:mod:`.bound`)."""

from __future__ import annotations

from dataclasses import dataclass

from prorsa_emulated.costmodel import ModelProfile

from ..policy import Observation, SwitchRequest

GRID_S = 60.0
"""CHOICE: segment length of a schedule. Four in-place switch times (15 s, costmodel) and
longer than the 10 s drain deadline plus the switch (25 s), so that a segment's switch
has landed before the next decision; fine enough to follow a step's prefill burst and
decode tail (steps last 300-4,500 s at paper scale)."""


def moves(obs: Observation, target: int, mode: str) -> list[SwitchRequest]:
    """The switches that bring the committed prefill count (engines in the prefill role
    and not switching, plus engines switching to prefill) to ``target``. CHOICE of which
    engines: from decode, the ones holding the least KV (fewest sequences a drain can
    abort); from prefill, the least queued. A switch in flight cannot be cancelled, so a
    target may be reached only at a later boundary."""
    committed = [(v.to_role if v.switching else v.role) for v in obs.engines]
    n_p = sum(r == "prefill" for r in committed)
    if target > n_p:
        donors = sorted((v for v in obs.engines if v.role == "decode" and not v.switching),
                        key=lambda v: (v.kv_used_tokens, v.running_reqs + v.queued_reqs, v.engine))
        return [SwitchRequest(v.engine, "prefill", mode) for v in donors[: target - n_p]]
    if target < n_p:
        donors = sorted((v for v in obs.engines if v.role == "prefill" and not v.switching),
                        key=lambda v: (v.queued_reqs + v.running_reqs, v.kv_used_tokens, v.engine))
        return [SwitchRequest(v.engine, "decode", mode) for v in donors[: n_p - target]]
    return []


def switch_mode_of(profile: ModelProfile, mode: str | None) -> str:
    """The switch mode asked for, else in place when the profile allows it."""
    return mode or ("in_place" if "in_place" in profile.switch_modes else "restart")


@dataclass
class SchedulePolicy:
    """Apply a piecewise-constant schedule: ``schedule[k]`` prefill engines from
    ``k * grid_s`` on (the last entry holds to the end). What the search's forks run and
    what the bound's reported run replays."""

    schedule: list[int]
    grid_s: float = GRID_S
    switch_mode: str | None = None
    name: str = "bound"
    wants_future: bool = False

    def initial_roles(self, profile: ModelProfile, n_engines: int) -> list[str]:
        p = self.schedule[0]
        if not 1 <= p <= n_engines - 1:
            raise ValueError(f"{self.name}: {p} prefill engines do not split {n_engines} engines")
        return ["prefill"] * p + ["decode"] * (n_engines - p)

    def on_window(self, obs: Observation) -> list[SwitchRequest]:
        k = round(obs.t / self.grid_s)
        if abs(obs.t - k * self.grid_s) > 1e-6 or k == 0:
            return []
        return moves(obs, self.schedule[min(k, len(self.schedule) - 1)], switch_mode_of(obs.profile, self.switch_mode))


def changes(schedule: list[int], grid_s: float) -> list[list[float]]:
    """``[[t, prefill engines], ...]`` where the schedule's target changes (t = 0 first)."""
    out: list[list[float]] = []
    for k, p in enumerate(schedule):
        if not out or out[-1][1] != p:
            out.append([round(k * grid_s, 3), p])
    return out


@dataclass
class RecordedPolicy:
    """Replay another run's switch requests (its summary's ``switch_requests``) from the
    split it started in: the same requests at the same windows. The simulator is
    deterministic and a policy acts on it only through its requests, so the replay is the
    recorded run again, to the event (what lets the ``bound`` count a policy's own run
    among its candidates). Requests made at a weight update (``on_update``) come back
    there. Each request is given once: one instance replays one run."""

    n_prefill: int
    requests: list
    """``[[t, engine, to_role, mode], ...]`` in the order they were asked."""
    name: str = "recorded"
    wants_future: bool = False

    def __post_init__(self) -> None:
        self._by_t: dict[float, list[SwitchRequest]] = {}
        for t, engine, to_role, mode in self.requests:
            self._by_t.setdefault(float(t), []).append(SwitchRequest(engine, to_role, mode))

    def initial_roles(self, profile: ModelProfile, n_engines: int) -> list[str]:
        if not 1 <= self.n_prefill <= n_engines - 1:
            raise ValueError(f"{self.name}: {self.n_prefill} prefill engines do not split {n_engines} engines")
        return ["prefill"] * self.n_prefill + ["decode"] * (n_engines - self.n_prefill)

    def on_window(self, obs: Observation) -> list[SwitchRequest]:
        return self._by_t.pop(obs.t, [])

    def on_update(self, obs: Observation) -> list[SwitchRequest]:
        """The requests made at a weight update (once: a window at the same time gets none)."""
        return self._by_t.pop(obs.t, [])

