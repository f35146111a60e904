"""Events that were already validated, read back cheaply: the tracker's hot path.

Every message is validated exactly once, strictly, by :func:`prorsa_schemas.decode_event`:
by the receiver process for live input, and before it ever reached the ``events`` table for
stored events. The fold then only needs the fields, so the second reading is a plain JSON
parse (pydantic-core's parser, ~2 us against ~4-7 us for a full validation) into a plain
object whose ``__dict__`` is the JSON object. :func:`load_validated` reproduces what
validation would have given the fold: absent optional fields read as their default (None),
a name that is no field of the event's type raises AttributeError (``getattr(ev, "traj",
None)`` works as on the models), and float fields are floats (strict validation turns a
JSON ``5`` into ``5.0``). Use it ONLY on bytes that passed
``decode_event``; anything else must go through ``decode_event``.
"""

from __future__ import annotations

import typing

from pydantic_core import from_json

from prorsa_schemas import EVENT_TYPES


class ValidatedEvent:
    """A validated event's fields as attributes (see the module docstring)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.__dict__!r})"


def _float_fields(model) -> tuple[str, ...]:
    out = []
    for name, f in model.model_fields.items():
        args = typing.get_args(f.annotation) or (f.annotation,)
        if float in args:
            out.append(name)
    return tuple(out)


FLOAT_FIELDS: dict[str, tuple[str, ...]] = {t: _float_fields(m) for t, m in EVENT_TYPES.items()}
DEFAULTS: dict[str, dict] = {
    t: {n: f.default for n, f in m.model_fields.items() if not f.is_required()} for t, m in EVENT_TYPES.items()
}
# One subclass per event type whose class attributes are the optional fields' defaults: an
# absent field then reads as its default without copying a defaults dict per event (the
# JSON object becomes the instance ``__dict__`` as it is; ~1 us/event less).
CLASSES: dict[str, type] = {
    t: type(f"Validated_{t.replace('.', '_')}", (ValidatedEvent,), dict(d)) for t, d in DEFAULTS.items()
}
_new = object.__new__


def load_validated(raw: bytes) -> ValidatedEvent:
    """Read an event that ``decode_event`` already accepted (see the module docstring)."""
    obj = from_json(raw)
    t = obj["type"]
    for name in FLOAT_FIELDS[t]:
        v = obj.get(name)
        if v.__class__ is int:
            obj[name] = float(v)
    ev = _new(CLASSES[t])
    ev.__dict__ = obj
    return ev
