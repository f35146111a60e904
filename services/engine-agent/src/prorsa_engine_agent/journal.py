"""The agent's local journal: launched process ids, switches in flight, commands done.

Written atomically (temp file + fsync + rename) before each phase runs, so an agent killed
with SIGKILL at any point restarts knowing which engines it launched, which switch was in
flight and at which phase, and which commands it already handled.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from .core import Switch
from .weights import Weights

MAX_DONE = 10_000


@dataclass
class Journal:
    path: Path
    pids: dict[str, int] = field(default_factory=dict)
    roles: dict[str, str] = field(default_factory=dict)
    inflight: dict[str, Switch] = field(default_factory=dict)
    done: dict[str, str] = field(default_factory=dict)  # cmd -> outcome
    weights: dict[str, Weights] = field(default_factory=dict)  # engine -> weights it was launched with

    @classmethod
    def load(cls, path: Path) -> "Journal":
        j = cls(path)
        if not path.exists():
            return j
        try:
            data = json.loads(path.read_text())
            j.pids = {k: int(v) for k, v in data.get("pids", {}).items()}
            j.roles = dict(data.get("roles", {}))
            j.inflight = {k: Switch.from_json(v) for k, v in data.get("inflight", {}).items()}
            j.done = dict(data.get("done", {}))
            j.weights = {k: Weights.from_json(v) for k, v in data.get("weights", {}).items()}
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"agent journal {path} is corrupt ({exc}); move it aside to start fresh") from None
        return j

    def seen(self, cmd: str) -> bool:
        return cmd in self.done or cmd in self.inflight

    def busy_with(self, engine: str) -> str | None:
        return next((sw.cmd for sw in self.inflight.values() if sw.engine == engine), None)

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if len(self.done) > MAX_DONE:
            for k in list(self.done)[: len(self.done) - MAX_DONE]:
                del self.done[k]
        data = {
            "pids": self.pids, "roles": self.roles, "done": self.done,
            "inflight": {k: v.to_json() for k, v in self.inflight.items()},
            "weights": {k: v.to_json() for k, v in self.weights.items()},
        }
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as fh:
            json.dump(data, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
