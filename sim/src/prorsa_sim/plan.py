"""A trajectory's plan: everything it will do, fixed at dispatch (drawn by
:mod:`.workloads`, or recorded in a log, :mod:`.recorded`)."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(slots=True)
class TrajectoryPlan:
    """Everything a trajectory will do, fixed at its dispatch."""

    prompt_tokens: int
    outputs: list[int]
    """Output tokens of each turn."""
    results: list[int]
    """Tool-result tokens appended after each turn but the last."""
    tool_s: list[float]
    cold_start_s: float
    prewarm_s: float
    reward_s: float
    admitted: bool
    reward: float
    sandbox: str | None = None
    """How its sandbox starts: None, the workload's rule (a prewarmed sandbox while the
    pool has one, else a cold start); ``"prewarm"`` or ``"cold"`` as recorded, or
    ``"none"`` (a recorded trajectory without sandbox events): see :func:`sandbox_start`."""

    def capped(self, max_turns: int | None = None, max_output: int | None = None) -> "TrajectoryPlan":
        """The plan cut to at most ``max_turns`` turns of at most ``max_output`` output
        tokens each (None: no cap), as the live rollout driver runs it; the tool calls
        and results of the turns cut go with them."""
        turns = len(self.outputs) if max_turns is None else max(1, min(len(self.outputs), max_turns))
        outs = self.outputs[:turns] if max_output is None else [min(o, max_output) for o in self.outputs[:turns]]
        return replace(self, outputs=outs, results=self.results[: turns - 1], tool_s=self.tool_s[: turns - 1])
