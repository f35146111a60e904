"""JSON Schema (draft 2020-12) of every event type, generated from the models.

One self-contained schema per type (nested objects under ``$defs``): what a producer in any
language can validate against before it publishes. ``prorsa schema`` prints them and
writes docs/schema/<type>.json; a test keeps those files equal to :func:`event_schemas`.

The schemas describe the wire, so ``v`` and ``type`` are required (the models default them
for events built in Python). Unknown fields are allowed (``additionalProperties: true``):
the contract's forward compatibility. The models are stricter than JSON Schema in one
place: JSON Schema's ``integer`` accepts ``12.0``, the models do not.
"""

from __future__ import annotations

import json
from typing import Any

from .envelope import CONTRACT_VERSION, Event
from .events import EVENT_TYPES
from .subjects import category

DIALECT = "https://json-schema.org/draft/2020-12/schema"

_ENVELOPE = ("v", "id", "type", "ts", "run")


def _strip_titles(node: Any) -> None:
    """Drop pydantic's generated per-property titles ("Prompt Tokens"): noise next to the name."""
    if isinstance(node, dict):
        props = node.get("properties")
        if isinstance(props, dict):
            for sub in props.values():
                if isinstance(sub, dict):
                    sub.pop("title", None)
        for value in node.values():
            _strip_titles(value)
    elif isinstance(node, list):
        for value in node:
            _strip_titles(value)


def event_schema(event_type: str) -> dict[str, Any]:
    """The JSON Schema of one event type (``KeyError`` for a type the contract lacks)."""
    model: type[Event] = EVENT_TYPES[event_type]
    body = model.model_json_schema(mode="validation")
    _strip_titles(body)
    props = body["properties"]
    for name in ("v", "type"):  # required on the wire: no default to fall back on
        props[name].pop("default", None)
    props["type"]["description"] = f"the event type: {event_type!r}"
    required = list(body.get("required", []))
    required = [n for n in _ENVELOPE] + [n for n in required if n not in _ENVELOPE]
    out: dict[str, Any] = {
        "$schema": DIALECT,
        "$id": f"{event_type}.json",
        "title": event_type,
        "description": (model.__doc__ or "").strip().replace("\n    ", " "),
        "x-prorsa-contract-version": CONTRACT_VERSION,
        "x-prorsa-category": category(event_type),
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": True,
    }
    if "$defs" in body:
        out["$defs"] = body["$defs"]
    return out


def event_schemas() -> dict[str, dict[str, Any]]:
    """Every event type's schema, by type, in sorted order."""
    return {t: event_schema(t) for t in sorted(EVENT_TYPES)}


def dumps(schema: dict[str, Any]) -> str:
    """The text form of a schema as checked in: indented, key order kept, final newline."""
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"
