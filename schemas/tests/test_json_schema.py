"""The JSON Schemas (docs/schema/<type>.json) are what the models give, and they agree with
the models on real events: valid ones pass, the contract's violations fail."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from prorsa_schemas import EVENT_TYPES, encode_event, event_from_dict
from prorsa_schemas.json_schema import dumps, event_schema, event_schemas

from .samples import FULL, event, minimal
from .test_events import VIOLATIONS

DOCS = Path(__file__).resolve().parents[2] / "docs"
REGENERATE = "prorsa schema --out docs/schema && prorsa schema --asyncapi --out docs/asyncapi.yaml"

# Violations JSON Schema cannot see (its `integer` accepts 1.0, the models do not); every
# other violation must fail the schema as it fails the models. ``(type, field, repr(value))``.
NOT_EXPRESSIBLE = {("request.queued", "dp_rank", "1.0")}


def _validator(event_type: str) -> Draft202012Validator:
    schema = event_schema(event_type)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def test_checked_in_schemas_are_the_models() -> None:
    folder = DOCS / "schema"
    assert folder.is_dir(), f"docs/schema is missing; run `{REGENERATE}`"
    on_disk = {p.name for p in folder.glob("*.json")}
    assert on_disk == {f"{t}.json" for t in EVENT_TYPES}, f"docs/schema lists other types; run `{REGENERATE}`"
    stale = [t for t, s in event_schemas().items() if (folder / f"{t}.json").read_text(encoding="utf-8") != dumps(s)]
    assert not stale, f"docs/schema/{{{','.join(stale)}}}.json differ from the models; run `{REGENERATE}`"


@pytest.mark.parametrize("kind", sorted(FULL))
def test_real_events_validate(kind: str) -> None:
    v = _validator(kind)
    for obj in (event(kind), minimal(kind), event(kind, colour="red", nested={"a": [1]})):
        v.validate(json.loads(encode_event(event_from_dict(obj))))  # as a producer puts it on the bus
        v.validate(obj)


@pytest.mark.parametrize(("kind", "field", "bad"), VIOLATIONS)
def test_contract_violations_fail_the_schema_too(kind: str, field: str, bad: object) -> None:
    errors = list(_validator(kind).iter_errors(event(kind, **{field: bad})))
    if (kind, field, repr(bad)) in NOT_EXPRESSIBLE:
        assert not errors
    else:
        assert errors, f"{kind}.{field}={bad!r} passes the JSON Schema but not the models"


@pytest.mark.parametrize("kind", sorted(FULL))
def test_envelope_and_type_are_required(kind: str) -> None:
    v = _validator(kind)
    for name in ("v", "id", "type", "ts", "run"):
        obj = event(kind)
        obj.pop(name)
        assert not v.is_valid(obj), name
    assert not v.is_valid(event(kind, type="policy.exploded"))


def test_contract_doc_names_every_field_of_every_model() -> None:
    # docs/contract.md is the contract plus the optional fields Prorsa adds: a field the
    # models declare must appear in its type's row of a table there.
    rows: dict[str, str] = {}
    for line in (DOCS / "contract.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("| `"):
            name = line.split("`")[1]
            rows[name] = rows.get(name, "") + line
    envelope = {"v", "id", "type", "ts", "run", "traj"}
    missing = [f"{t}.{f}" for t, model in EVENT_TYPES.items() for f in model.model_fields
               if f not in envelope and f"`{f}`" not in rows.get(t, "") and f" {f}" not in rows.get(t, "")]
    assert not missing, f"docs/contract.md does not list {missing} (add each to 'Optional fields Prorsa adds')"
