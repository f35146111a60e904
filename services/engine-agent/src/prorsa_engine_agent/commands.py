"""The agent's commands: each ``engine.command`` validated, decided (:mod:`.core`),
journaled and carried out (:mod:`.procedure`), and its outcome published. Mixed into
:class:`~prorsa_engine_agent.agent.EngineAgent`.

A command message it cannot handle (not a valid event, not an ``engine.command``, or on a
subject its type does not belong to) is dead-lettered (:mod:`prorsa_runtime.deadletter`: a
log line with subject, stream sequence, reason, size and hash;
``prorsa_agent_dead_letters_total{kind}``) and acknowledged; a malformed command that
names a usable ``cmd`` and one of its engines is also answered with ``engine.switch_failed``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import replace

from prorsa_runtime.deadletter import DeadLetters
from prorsa_schemas import (
    EngineCommand,
    EngineDeregistered,
    EngineSwitched,
    EngineSwitchFailed,
    EngineSwitching,
    EventError,
    Namespace,
    SubjectMismatch,
    decode_event,
    decode_message,
)

from .config import AgentSettings
from .core import Phase, Switch, Verdict, begin, decide, event_id
from .instances import EngineState, Instances
from .journal import Journal
from .metrics import AgentMetrics
from .procedure import run_switch

log = logging.getLogger("prorsa.engine_agent")


class Commands(Instances):
    """The command side of the agent (uses, beyond :class:`~.instances.Instances`, its
    ``ns``, ``elsewhere``, ``metrics`` and ``dead_letters``)."""

    ns: Namespace
    settings: AgentSettings
    journal: Journal
    elsewhere: dict[str, str]
    metrics: AgentMetrics
    dead_letters: DeadLetters

    # -- switches -------------------------------------------------------------------------------
    async def execute(self, st: EngineState, sw: Switch, announce: bool = True) -> None:
        """Run the switch; ``engine.switching`` goes out once PRECHECK has passed (a refusal
        there is only an ``engine.switch_failed``)."""
        def started(s: Switch) -> None:
            self.publish(EngineSwitching, event_id(s.cmd, "switching"), run=s.run, engine=s.engine,
                         cmd=s.cmd, from_role=s.from_role, to_role=s.to_role, mode=s.mode)

        async with st.lock:
            try:
                sw = await run_switch(self, st, sw, started if announce else None)
            except Exception as exc:  # a bug must not leave the command without an outcome
                log.exception("switch %s crashed", sw.cmd)
                sw = replace(sw, phase=Phase.FAILED, error=f"agent error: {exc!r}")
            self.finish(st, sw)

    def finish(self, st: EngineState, sw: Switch) -> None:
        # aborted_reqs (optional, docs/contract.md): requests the switch aborted, for the
        # framework to retry; absent when it aborted none.
        extra = {"aborted_reqs": sw.aborted or None}
        if sw.phase is Phase.DONE:
            self.publish(EngineSwitched, event_id(sw.cmd, "switched"), run=sw.run, engine=sw.engine,
                         cmd=sw.cmd, from_role=sw.from_role, to_role=sw.to_role,
                         seconds=max(0.0, time.time() - sw.started), mode=sw.mode, **extra)
            outcome = "switched"
        else:
            role = st.role or sw.from_role
            self.publish(EngineSwitchFailed, event_id(sw.cmd, "failed"), run=sw.run, engine=sw.engine,
                         cmd=sw.cmd, role=role, error=(sw.error or "failed")[:4096], **extra)
            outcome = "failed"
            if sw.phase is Phase.DOWN:
                st.up = False
                self.publish(EngineDeregistered, engine=sw.engine,
                             reason=f"down after failed switch {sw.cmd}: {sw.error}"[:4096])
        self.journal.inflight.pop(sw.cmd, None)
        self.journal.done[sw.cmd] = outcome
        self.metrics.record(outcome, max(0.0, time.time() - sw.started) if outcome == "switched" else None)
        self.journal.save()
        log.info("%s %s: %s %s", sw.engine, sw.cmd, outcome, sw.error)

    def refuse(self, cmd: str, engine: str, run: str, reason: str, role: str) -> None:
        log.warning("refused command %s for %s: %s", cmd, engine, reason)
        self.publish(EngineSwitchFailed, event_id(cmd, "failed"), run=run, engine=engine, cmd=cmd,
                     role=role, error=reason[:4096])

    async def handle(self, data: bytes, subject: str | None = None, seq: int | None = None) -> None:
        """One message from the command subject: validate, decide, start a switch.

        With ``subject``, the event's type must belong on it; a message that is no valid
        command is dead-lettered (and refused when it names a usable cmd and engine).
        """
        try:
            event = decode_event(data) if subject is None else decode_message(data, subject, self.ns)
            if not isinstance(event, EngineCommand):
                raise EventError.single(f"expected an engine.command, got {event.type!r}", "type")
        except SubjectMismatch as exc:
            self.dead_letters.record("subject", subject, seq, data, exc.reason)
            return
        except EventError as exc:
            self.dead_letters.record("invalid", subject, seq, data, exc.reason)
            self._refuse_malformed(data, exc.reason)
            return
        cmd = event
        st = self.engines.get(cmd.engine)
        if st is None and cmd.engine not in self.elsewhere and self.settings.unknown_engine_grace_s:
            # Another agent may own it and its registration may not have reached us yet.
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.settings.unknown_engine_grace_s
            while cmd.engine not in self.elsewhere and loop.time() < deadline:
                await asyncio.sleep(0.05)
        role = st.role if st is not None and st.up else None
        modes = [m for m in (st.inst.switch_modes() if st else []) if m != "in_place" or st.role != "mixed"]
        d = decide(cmd, now=time.time(), role=role if st is not None else None, modes=modes,
                   seen=self.journal.seen(cmd.cmd), busy_with=self.journal.busy_with(cmd.engine),
                   elsewhere=cmd.engine in self.elsewhere, blockers=st.inst.in_place_blockers() if st else [])
        if st is not None and not st.up and d.verdict is not Verdict.DUPLICATE:
            self.refuse(cmd.cmd, cmd.engine, cmd.run, f"engine {cmd.engine} is down", st.role or "mixed")
            self.journal.done[cmd.cmd] = "refused"
            self.journal.save()
            return
        if d.verdict is Verdict.DUPLICATE:
            log.info("duplicate command %s ignored", cmd.cmd)
        elif d.verdict is Verdict.IGNORE:
            pass
        elif d.verdict is Verdict.REFUSE:
            # An unknown engine has no role; "mixed" is the contract's only neutral value.
            self.refuse(cmd.cmd, cmd.engine, cmd.run, d.reason, st.role if st else "mixed")
            self.journal.done[cmd.cmd] = "refused"
            self.journal.save()
        elif d.verdict is Verdict.ALREADY:
            assert st is not None
            self.publish(EngineSwitched, event_id(cmd.cmd, "switched"), run=cmd.run, engine=cmd.engine,
                         cmd=cmd.cmd, from_role=st.role, to_role=cmd.to_role, seconds=0.0)
            self.journal.done[cmd.cmd] = "switched"
            self.journal.save()
        else:
            assert st is not None
            sw = begin(cmd, st.role, d.mode, time.time())
            # Journal before acknowledging the message: a crash from here on is resumed.
            self.journal.inflight[sw.cmd] = sw
            self.journal.save()
            self.spawn(self.execute(st, sw))

    def _refuse_malformed(self, data: bytes, reason: str) -> None:
        log.error("malformed command: %s", reason)
        try:
            obj = json.loads(data)
        except Exception:  # noqa: BLE001 - not JSON, or JSON no parser takes (nested too deep)
            obj = None
        obj = obj if isinstance(obj, dict) else {}
        cmd, engine, run = obj.get("cmd"), obj.get("engine"), obj.get("run")
        ok_id = lambda v: isinstance(v, str) and 0 < len(v) <= 128 and v.isprintable()  # noqa: E731
        if not (ok_id(cmd) and ok_id(engine)):
            log.error("malformed command has no usable cmd/engine ids; nothing to answer")
            return
        st = self.engines.get(engine)
        if st is None and engine in self.elsewhere:
            return  # the owning agent answers
        run_ok = isinstance(run, str) and run and all(c.isalnum() or c in "_.-" for c in run) and len(run) <= 128
        self.refuse(cmd, engine, run if run_ok else self.settings.run,
                    f"malformed command: {reason}", st.role if st and st.role else "mixed")

    def _for_us(self, data: bytes) -> bool:
        try:
            obj = json.loads(data)
        except Exception:  # noqa: BLE001 - unreadable: handled (dead-lettered) right here
            return True
        engine = obj.get("engine") if isinstance(obj, dict) else None
        return not isinstance(engine, str) or engine in self.engines  # not an engine id: handled here

    async def _handle_safely(self, data: bytes, subject: str | None = None, seq: int | None = None) -> None:
        try:
            await self.handle(data, subject, seq)
        except Exception as exc:
            log.exception("handling a command failed")
            self.dead_letters.record("handler", subject, seq, data, f"the agent failed on it: {exc!r}")

