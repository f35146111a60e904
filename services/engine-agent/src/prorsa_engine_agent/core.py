"""The switch procedure as a pure state machine, and the decision on each command.

No I/O and no clock: the shell passes ``now`` in and carries out each phase. A phase is
idempotent (running it twice has the effect of running it once), which is what lets an
agent that was killed mid-switch resume from its journal.

Happy path::

    PRECHECK -> DEREGISTER -> DRAIN -> (ABORT) -> SWITCH | RESTART -> HEALTH -> REGISTER -> DONE

An in-place flip that SGLang refuses because the engine is not idle (a request reached it
between the drain's reading and the flip: one the router had sent before the removal, or
one still in the HTTP/tokenizer layer, which ``/v1/loads`` does not see), or a restart that
finds the engine busy just before the stop, goes back to DRAIN, up to ``MAX_REDRAINS``
times; the old role is intact, so nothing is lost by waiting again.

PRECHECK touches nothing: when a condition SGLang or the weights need does not hold, the
switch is refused (FAILED) with the engine as it was. On a later failure: RESTORE_REGISTER (the old role is intact: put it back in the router) when it
is safe to restore, else RESTORE_RESTART (relaunch in the old role) -> RESTORE_REGISTER
-> FAILED; DOWN when even that is impossible.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from enum import Enum

from prorsa_schemas import EngineCommand


class Phase(str, Enum):
    PRECHECK = "precheck"
    DEREGISTER = "deregister"
    DRAIN = "drain"
    ABORT = "abort"
    SWITCH = "switch"
    RESTART = "restart"
    HEALTH = "health"
    REGISTER = "register"
    RESTORE_RESTART = "restore_restart"
    RESTORE_REGISTER = "restore_register"
    DONE = "done"
    FAILED = "failed"
    DOWN = "down"


FINAL = frozenset({Phase.DONE, Phase.FAILED, Phase.DOWN})
MAX_REDRAINS = 3
"""How many times a busy engine at the flip (SGLang's "not idle") or at a restart's stop
sends the switch back to DRAIN before it fails (each DRAIN waits until the command's
deadline at most, then aborts what is left)."""
DRAINING = frozenset({Phase.DEREGISTER, Phase.DRAIN, Phase.ABORT})


@dataclass(frozen=True)
class Switch:
    """One role switch in progress (what the journal stores)."""

    cmd: str
    engine: str
    run: str
    from_role: str
    to_role: str
    mode: str  # "in_place" | "restart"
    deadline: float
    started: float
    phase: Phase = Phase.PRECHECK
    role_now: str = ""
    error: str = ""
    model_path: str = ""
    """Restart mode: the weights to relaunch with (found by PRECHECK; "" until then)."""
    weight_version: str = ""
    aborted: int = 0
    """Requests the switch aborted (running + waiting when it first sent abort_all)."""
    redrains: int = 0
    """Times the flip or the restart found the engine busy and the switch drained again."""

    def to_json(self) -> dict:
        d = self.__dict__.copy()
        d["phase"] = self.phase.value
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Switch":
        return cls(**{**d, "phase": Phase(d["phase"])})


def begin(cmd: EngineCommand, role: str, mode: str, now: float) -> Switch:
    """A new procedure for an accepted command."""
    return Switch(cmd.cmd, cmd.engine, cmd.run, role, cmd.to_role, mode, cmd.deadline, now,
                  role_now=role)


def advance(sw: Switch, ok: bool, detail: str = "", *, safe_to_restore: bool = True,
            can_restart: bool = True, busy: bool = False) -> Switch:
    """The next phase after ``sw.phase`` succeeded (``ok``) or failed (``detail`` says why).
    ``busy``: the in-place flip, or the restart before its stop, found the engine not idle."""
    p = sw.phase
    if p in FINAL:
        raise ValueError(f"switch {sw.cmd} is already {p.value}")

    def fail(error: str, nxt: Phase) -> Switch:
        err = sw.error or error
        return replace(sw, phase=nxt, error=err)

    def restore() -> Switch:
        if can_restart:
            return fail(detail, Phase.RESTORE_RESTART)
        return fail(detail, Phase.DOWN)

    work = Phase.SWITCH if sw.mode == "in_place" else Phase.RESTART
    if p is Phase.PRECHECK:
        return replace(sw, phase=Phase.DEREGISTER) if ok else fail(f"switch refused: {detail}", Phase.FAILED)
    if p is Phase.DEREGISTER:
        return replace(sw, phase=Phase.DRAIN) if ok else fail(f"taking it off the router: {detail}", Phase.RESTORE_REGISTER)
    if p is Phase.DRAIN:
        return replace(sw, phase=work if ok else Phase.ABORT)
    if p is Phase.ABORT:
        return replace(sw, phase=work) if ok else fail(f"timed out draining: {detail}", Phase.RESTORE_REGISTER)
    if p in (Phase.SWITCH, Phase.RESTART):
        if ok:
            return replace(sw, phase=Phase.HEALTH, role_now=sw.to_role)
        if busy and safe_to_restore and sw.redrains < MAX_REDRAINS:
            return replace(sw, phase=Phase.DRAIN, redrains=sw.redrains + 1)
        if p is Phase.SWITCH and safe_to_restore:
            return fail(f"in-place switch refused: {detail}", Phase.RESTORE_REGISTER)
        if p is Phase.RESTART and safe_to_restore:  # refused before the engine was stopped
            return fail(f"restart refused: {detail}", Phase.RESTORE_REGISTER)
        detail = f"{p.value} failed: {detail}"
        return restore()
    if p is Phase.HEALTH:
        if ok:
            return replace(sw, phase=Phase.REGISTER)
        detail = f"not healthy after the switch: {detail}"
        return restore()
    if p is Phase.REGISTER:
        return replace(sw, phase=Phase.DONE) if ok else fail(f"router registration failed: {detail}", Phase.FAILED)
    if p is Phase.RESTORE_RESTART:
        if ok:
            return replace(sw, phase=Phase.RESTORE_REGISTER, role_now=sw.from_role)
        return fail(f"restore failed: {detail}", Phase.DOWN)
    if p is Phase.RESTORE_REGISTER:
        if ok:
            return replace(sw, phase=Phase.FAILED)
        return replace(sw, phase=Phase.FAILED, error=f"{sw.error}; re-registration failed: {detail}")
    raise AssertionError(p)  # pragma: no cover


def resume(sw: Switch) -> Switch:
    """Where a journaled switch continues after an agent restart.

    While draining, nothing irreversible has happened: abandon it and put the engine back
    in the router. Past that point, re-run the phase (phases are idempotent). A PRECHECK
    is run again (it touches nothing).
    """
    if sw.phase in DRAINING:
        return replace(sw, phase=Phase.RESTORE_REGISTER,
                       error=sw.error or "agent restarted while draining; switch abandoned")
    return sw


# -- deciding what to do with a command ----------------------------------------------------


class Verdict(str, Enum):
    EXECUTE = "execute"
    DUPLICATE = "duplicate"
    IGNORE = "ignore"  # another agent's engine
    REFUSE = "refuse"
    ALREADY = "already"  # already in the target role


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reason: str = ""
    mode: str = ""


def decide(cmd: EngineCommand, *, now: float, role: str | None, modes: list[str],
           seen: bool, busy_with: str | None, elsewhere: bool, blockers: list[str]) -> Decision:
    """What to do with a valid command.

    Args:
        role: the engine's current role, None when this agent does not own the engine.
        modes: the switch modes the engine supports, preferred first.
        seen: this ``cmd`` was accepted before (in flight or finished).
        busy_with: the ``cmd`` of a switch in flight on this engine, if any.
        elsewhere: another agent has registered the engine.
        blockers: why an in-place switch is impossible (for the refusal message).
    """
    if seen:
        return Decision(Verdict.DUPLICATE, f"command {cmd.cmd} was already accepted")
    if role is None:
        if elsewhere:
            return Decision(Verdict.IGNORE, "engine owned by another agent")
        return Decision(Verdict.REFUSE, f"unknown engine {cmd.engine!r}: no engine agent has registered it")
    if now > cmd.deadline:
        return Decision(Verdict.REFUSE, f"deadline {cmd.deadline:.3f} passed before the command "
                                        f"was taken up (now {now:.3f})")
    if busy_with is not None:
        return Decision(Verdict.REFUSE, f"engine {cmd.engine} is already switching (command {busy_with}); "
                                        "one switch per engine at a time")
    if role == cmd.to_role:
        return Decision(Verdict.ALREADY, f"engine {cmd.engine} is already {role}")
    if not modes:
        return Decision(Verdict.REFUSE, f"engine {cmd.engine} cannot switch: no in-place switch "
                                        f"({', '.join(blockers)}) and it is external (not launched by the agent)")
    return Decision(Verdict.EXECUTE, mode=modes[0])


def event_id(cmd: str, what: str) -> str:
    """A deterministic event id for a command's outcome, so a re-publish (after an agent
    restart, or by several agents refusing the same unknown engine) is de-duplicated."""
    base = f"{cmd}/{what}"
    if len(base) <= 128:
        return base
    return f"{hashlib.sha256(cmd.encode()).hexdigest()[:40]}/{what}"
