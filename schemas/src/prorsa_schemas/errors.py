"""The one error type that invalid input raises, with a reason a person can act on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

_MAX_VALUE_REPR = 80


def _short(value: Any) -> str:
    text = repr(value)
    if len(text) > _MAX_VALUE_REPR:
        text = text[: _MAX_VALUE_REPR - 3] + "..."
    return text


@dataclass(frozen=True)
class Violation:
    """One broken rule: which field, what value it had, what rule it broke."""

    field: str
    value: Any
    rule: str

    def __str__(self) -> str:
        if self.field:
            if self.value is MISSING:
                return f"field '{self.field}': {self.rule}"
            return f"field '{self.field}': value {_short(self.value)} {self.rule}"
        return self.rule


MISSING = object()
"""The value of a :class:`Violation` whose field is absent (or that names no field)."""


class EventError(ValueError):
    """An event (or a line of a log) is not valid under the contract.

    Attributes:
        violations: every rule the input broke, in the order pydantic found them.
        reason: one line naming the field, the value and the rule, for people and logs.
    """

    def __init__(self, violations: list[Violation]):
        self.violations = violations
        self.reason = "; ".join(str(v) for v in violations) or "invalid event"
        super().__init__(self.reason)

    @property
    def field(self) -> str:
        return self.violations[0].field if self.violations else ""

    @classmethod
    def single(cls, rule: str, field: str = "", value: Any = MISSING) -> "EventError":
        return cls([Violation(field, value, rule)])

    @classmethod
    def from_validation(cls, exc: ValidationError, raw_type: str | None = None) -> "EventError":
        violations: list[Violation] = []
        for err in exc.errors(include_url=False):
            loc = list(err["loc"])
            # A discriminated union puts the tag first in the location: drop it, the
            # reason already says which type was being validated.
            if raw_type is not None and loc and loc[0] == raw_type:
                loc = loc[1:]
            field = ""
            for part in loc:
                field += f"[{part}]" if isinstance(part, int) else (f".{part}" if field else str(part))
            kind = err["type"]
            value = err.get("input", MISSING)
            if kind == "missing":
                violations.append(Violation(field, MISSING, "is required but missing"))
            elif kind == "extra_forbidden":
                violations.append(Violation(field, MISSING, "is not a field of this event type"))
            elif kind == "union_tag_invalid":
                ctx = err.get("ctx", {})
                violations.append(
                    Violation("type", ctx.get("tag", value), "is not a known event type")
                )
            elif kind == "union_tag_not_found":
                violations.append(Violation("type", MISSING, "is required but missing"))
            elif kind == "json_invalid":
                msg = err["msg"]
                if "recursion limit" in msg:  # e.g. 1,000 nested '[': say what is wrong with it
                    msg = f"nested too deeply to parse: {msg.removeprefix('Invalid JSON: ')}"
                violations.append(Violation("", MISSING, f"not valid JSON ({msg})"))
            elif kind in ("model_type", "model_attributes_type", "dict_type") and not field:
                violations.append(Violation("", MISSING, "an event must be a JSON object"))
            else:
                violations.append(Violation(field, value, _rule(err)))
        return cls(violations)


def _rule(err: dict[str, Any]) -> str:
    kind = err["type"]
    msg = err["msg"]
    if kind == "literal_error" and err["loc"] and err["loc"][-1] == "v":
        return "is not a supported contract version (expected 1)"
    if kind == "string_pattern_mismatch":
        pattern = err.get("ctx", {}).get("pattern", "")
        if "A-Za-z0-9" in pattern:
            return "must contain only the characters [A-Za-z0-9_.-]"
        return "must contain only printable characters"
    if kind.endswith("_type"):
        return f"has the wrong type ({msg[0].lower() + msg[1:]})"
    return f"violates the rule: {msg[0].lower() + msg[1:]}"


class SubjectMismatch(EventError):
    """A valid event on a subject its type does not belong to (see
    :meth:`prorsa_schemas.Namespace.subject_mismatch`); ``event`` is the decoded event."""

    def __init__(self, reason: str, event: object) -> None:
        super().__init__([Violation("", MISSING, reason)])
        self.event = event
