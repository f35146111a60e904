"""The AsyncAPI 3.0 document of Prorsa's NATS subjects (docs/asyncapi.yaml).

Built from the same sources as the services: the subjects come from
:class:`prorsa_schemas.Namespace`, the event payloads are the JSON Schemas of
:mod:`prorsa_schemas.json_schema` (referenced as files, ``schema/<type>.json``), and the
tracker's own outputs (transitions, watermark, anomalies; no part of the event contract)
are described by schemas generated from the tracker's types (``schema/tracker/<name>.json``).
``prorsa schema --asyncapi`` prints it; a test keeps the checked-in file equal to it.
"""

from __future__ import annotations

from typing import Any

from prorsa_schemas import CONTRACT_VERSION, EVENT_TYPES, Namespace, category
from prorsa_schemas.json_schema import DIALECT

PREFIX_PARAM = "prefix"
_NS = Namespace(prefix="PREFIX")  # subjects with a placeholder prefix, turned into "{prefix}"

# Who publishes and who reads each category / type (the services' subscriptions).
_ROLLOUT = ("the RL framework through the client SDK (also `prorsa publish`, `prorsa replay`, the simulator)",
            "tracker, forecaster")
_ENGINE = ("engine agents (also the simulator)", "tracker, forecaster, allocator; engine agents read "
           "engine.registered; `prorsa switch` waits for the outcome of its command")
# Rollout types read beyond the tracker and the forecaster.
_ROLLOUT_READERS = {
    "policy.updated": "tracker, forecaster, allocator (the weight-update pause and the step's opening); engine "
                      "agents (the weights their engines serve)",
    "run.started": "tracker, forecaster, allocator (the run's mode decides its 'auto' objective)",
}
_CONTROL = {
    "forecast.window": ("forecaster", "tracker, allocator; the forecaster reads its last one on start"),
    "allocation.plan": ("allocator", "tracker, allocator"),
    "engine.command": ("allocator (also `prorsa switch`)", "engine agents, tracker, allocator"),
}

TRACKER_OUTPUTS: dict[str, tuple[str, str]] = {
    "transitions": ("a JSON array of up to 1000 canonical state transitions, in stream order; header "
                    "Nats-Msg-Id `tr-<first seq>-<last seq>`", "external readers (no Prorsa service reads it)"),
    "watermark": ("event time has reached `ts`: no earlier event follows, from the tracker's view of the stream "
                  "up to `seq`; a heartbeat at wall time when the bus is quiet", "forecaster, allocator"),
    "anomalies": ("one anomaly notice: a valid event the trajectory state machine refused, or an invalid one "
                  "(`event_id` null)", "external readers (no Prorsa service reads it)"),
}


def _address(subject: str) -> str:
    assert subject.startswith("PREFIX.")
    return "{" + PREFIX_PARAM + "}" + subject[len("PREFIX"):]


def _key(name: str) -> str:
    return name.replace(".", "_")


def tracker_schemas() -> dict[str, dict[str, Any]]:
    """JSON Schemas of the tracker's outputs, by name (``transitions``, ``watermark``,
    ``anomalies``): what the tracker publishes on ``prorsa.tracker.<name>``."""
    from pydantic import TypeAdapter
    from prorsa_tracker.outputs import Watermark
    from prorsa_tracker.state import Anomaly, Transition

    adapters = {"transitions": TypeAdapter(list[Transition]), "watermark": TypeAdapter(Watermark),
                "anomalies": TypeAdapter(Anomaly)}
    out = {}
    for name, adapter in adapters.items():
        body = adapter.json_schema(mode="serialization")
        out[name] = {"$schema": DIALECT, "$id": f"{name}.json", "title": f"tracker.{name}",
                     "description": TRACKER_OUTPUTS[name][0] + " (a tracker output, not part of the event contract)",
                     **{k: v for k, v in body.items() if k not in ("title", "description")}}
    return out


def _message(name: str, title: str, summary: str, payload_ref: str, msg_id_header: str | None) -> dict[str, Any]:
    msg: dict[str, Any] = {"name": title, "title": title, "summary": summary, "contentType": "application/json",
                           "payload": {"$ref": payload_ref}}
    if msg_id_header:
        msg["headers"] = {"type": "object", "properties": {"Nats-Msg-Id": {"type": "string", "description": msg_id_header}}}
    return msg


def asyncapi_document(schema_dir: str = "./schema") -> dict[str, Any]:
    """The AsyncAPI 3.0.0 document; payloads reference ``<schema_dir>/<type>.json`` and
    ``<schema_dir>/tracker/<name>.json`` (relative to the document)."""
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    prefix_param = {"default": "prorsa", "description": "subject prefix (`--prefix`, `PRORSA_SUBJECT_PREFIX`); "
                    "the stream (default PRORSA, `--stream`, `PRORSA_STREAM`) captures `{prefix}.>`"}

    def add(key: str, address: str, title: str, summary: str, payload: str, msg_id: str | None,
            producer: str, consumers: str) -> None:
        messages[key] = _message(key, title, summary, payload, msg_id)
        channels[key] = {"address": address, "title": title, "description": summary,
                         "parameters": {PREFIX_PARAM: {"$ref": f"#/components/parameters/{PREFIX_PARAM}"}},
                         "messages": {key: {"$ref": f"#/components/messages/{key}"}}}
        ref = {"$ref": f"#/channels/{key}"}
        msg_ref = [{"$ref": f"#/channels/{key}/messages/{key}"}]
        operations[f"send_{key}"] = {"action": "send", "channel": ref, "messages": msg_ref,
                                     "summary": f"published by {producer}"}
        operations[f"receive_{key}"] = {"action": "receive", "channel": ref, "messages": msg_ref,
                                        "summary": f"read by {consumers}"}

    for t in EVENT_TYPES:  # the contract's order: rollout, engine, control events
        kind = category(t)
        producer, consumers = _ROLLOUT if kind == "rollout" else _ENGINE if kind == "engine" else _CONTROL[t]
        if kind == "rollout":
            consumers = _ROLLOUT_READERS.get(t, consumers)
        doc = (EVENT_TYPES[t].__doc__ or "").strip().replace("\n    ", " ")
        add(_key(t), _address(_NS.subject_for_type(t)), t, doc, f"{schema_dir}/{t}.json",
            "the event's `id` (JetStream de-duplication)", producer, consumers)
    subjects = {"transitions": _NS.transitions(), "watermark": _NS.watermark(), "anomalies": _NS.anomalies()}
    for name, (summary, consumers) in TRACKER_OUTPUTS.items():
        add(f"tracker_{name}", _address(subjects[name]), f"tracker.{name}", summary + " (not part of the event contract)",
            f"{schema_dir}/tracker/{name}.json", "`tr-<first seq>-<last seq>`" if name == "transitions" else None,
            "the tracker", consumers)
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "Prorsa events",
            "version": f"{CONTRACT_VERSION}.0.0",
            "description": ("The NATS subjects of Prorsa and the messages on them. One event is one JSON object, "
                            "one event per message (the contract: docs/contract.md). Every consumer reads its "
                            "subjects from the JetStream stream (default PRORSA, capturing `{prefix}.>`), rejects "
                            "an event published on another type's subject, and accepts fields a type does not "
                            "name. Generated by `prorsa schema --asyncapi`."),
        },
        "defaultContentType": "application/json",
        "servers": {"local": {"host": "localhost:4222", "protocol": "nats",
                              "description": "a local nats-server with JetStream (`prorsa nats`)"}},
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages, "parameters": {PREFIX_PARAM: prefix_param}},
    }
