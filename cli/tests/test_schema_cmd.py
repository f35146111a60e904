"""`prorsa schema`: the checked-in docs/schema/ and docs/asyncapi.yaml are what the models
give, the AsyncAPI document is a well-formed AsyncAPI 3.0 description of every subject,
and real messages validate against the schemas it references."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from jsonschema import Draft202012Validator

from prorsa_cli.asyncapi import TRACKER_OUTPUTS
from prorsa_cli.schema_cmd import REGENERATE, asyncapi_text, schema_files
from prorsa_schemas import DEFAULT, EVENT_TYPES, encode_event
from prorsa_tracker.core import apply_all, new_state
from prorsa_tracker.examples import iter_workload
from prorsa_tracker.state import encode_transitions

DOCS = Path(__file__).resolve().parents[2] / "docs"
PRORSA = [sys.executable, "-m", "prorsa_cli.main"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    return subprocess.run([*PRORSA, *args], capture_output=True, text=True, timeout=120, env=env)


def _doc() -> dict:
    return yaml.safe_load((DOCS / "asyncapi.yaml").read_text(encoding="utf-8"))


def _resolve(doc: dict, ref: str) -> object:
    assert ref.startswith("#/"), ref
    node: object = doc
    for part in ref[2:].split("/"):
        assert isinstance(node, dict) and part in node, f"dangling $ref {ref}"
        node = node[part]
    return node


def test_checked_in_files_are_what_the_models_give() -> None:
    want = schema_files()
    have = {str(p.relative_to(DOCS / "schema")): p.read_text(encoding="utf-8") for p in (DOCS / "schema").rglob("*.json")}
    assert set(have) == set(want), f"docs/schema holds other files than the generator writes; run `{REGENERATE}`"
    stale = sorted(rel for rel in want if have[rel] != want[rel])
    assert not stale, f"docs/schema/{stale} differ from the models; run `{REGENERATE}`"
    assert (DOCS / "asyncapi.yaml").read_text(encoding="utf-8") == asyncapi_text(), (
        f"docs/asyncapi.yaml differs from the models and subjects; run `{REGENERATE}`")


def test_asyncapi_is_an_asyncapi_3_document_of_every_subject() -> None:
    doc = _doc()
    assert doc["asyncapi"] == "3.0.0"
    assert doc["info"]["title"] and doc["info"]["version"]
    channels, operations = doc["channels"], doc["operations"]
    prefix = doc["components"]["parameters"]["prefix"]["default"]
    addresses = {ch["address"].replace("{prefix}", prefix): key for key, ch in channels.items()}
    subjects = [DEFAULT.subject_for_type(t) for t in EVENT_TYPES]
    subjects += [DEFAULT.transitions(), DEFAULT.watermark(), DEFAULT.anomalies()]
    assert sorted(addresses) == sorted(subjects)
    sent: set[str] = set()
    for key, ch in channels.items():
        assert set(ch["parameters"]) == {"prefix"} and _resolve(doc, ch["parameters"]["prefix"]["$ref"])
        for msg_ref in ch["messages"].values():
            msg = _resolve(doc, msg_ref["$ref"])
            payload = msg["payload"]["$ref"]
            assert (DOCS / payload).is_file(), f"message {key} references {payload}, which is no file"
            schema = json.loads((DOCS / payload).read_text(encoding="utf-8"))
            Draft202012Validator.check_schema(schema)
            assert msg["contentType"] == "application/json"
    for op_id, op in operations.items():
        assert op["action"] in ("send", "receive"), op_id
        ch = _resolve(doc, op["channel"]["$ref"])
        assert ch in channels.values()
        for m in op["messages"]:
            assert m["$ref"].startswith(op["channel"]["$ref"] + "/messages/"), (op_id, m)
            _resolve(doc, m["$ref"])
        if op["action"] == "send":
            sent.add(op["channel"]["$ref"].removeprefix("#/channels/"))
    assert sent == set(channels), "every channel has a producer (a send operation)"
    by_type = {msg["name"]: msg for msg in doc["components"]["messages"].values()}
    assert set(EVENT_TYPES) | {f"tracker.{n}" for n in TRACKER_OUTPUTS} == set(by_type)


def test_real_messages_validate_against_the_referenced_schemas() -> None:
    doc = _doc()
    validators = {msg["name"]: Draft202012Validator(json.loads((DOCS / msg["payload"]["$ref"]).read_text()))
                  for msg in doc["components"]["messages"].values()}
    events = list(iter_workload(3000, live=40))
    seen = set()
    for ev in events:
        validators[ev.type].validate(json.loads(encode_event(ev)))
        seen.add(ev.type)
    assert len(seen) >= 10
    _, transitions, _ = apply_all(new_state(), events)
    assert transitions
    validators["tracker.transitions"].validate(json.loads(encode_transitions(transitions[:500])))
    bad = json.loads(encode_event(events[0]))
    bad.pop("id")
    assert not validators[events[0].type].is_valid(bad)


def test_the_command(tmp_path: Path) -> None:
    res = run("schema", "--out", str(tmp_path / "s"))
    assert res.returncode == 0, res.stderr
    written = {str(p.relative_to(tmp_path / "s")): p.read_text() for p in (tmp_path / "s").rglob("*.json")}
    assert written == schema_files()
    res = run("schema", "request.queued")
    assert res.returncode == 0 and json.loads(res.stdout)["title"] == "request.queued"
    res = run("schema", "--asyncapi")
    assert res.returncode == 0 and res.stdout == asyncapi_text()
    res = run("schema", "request.exploded")
    assert res.returncode == 2 and "unknown event type 'request.exploded'" in res.stderr
    assert "request.queued" in res.stderr  # the valid types are listed
