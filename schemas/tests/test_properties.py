"""Property-based tests (hypothesis) over valid events of every type."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from prorsa_schemas import EVENT_TYPES, MAX_TOKENS, decode_event, encode_event, event_from_dict

from .samples import FULL, OPTIONAL, event

ids = st.text(
    alphabet=st.characters(blacklist_categories=("Cc", "Cs"), blacklist_characters="\x7f"),
    min_size=1, max_size=128,
)
runs = st.from_regex(r"[A-Za-z0-9_.-]{1,128}", fullmatch=True)
tokens = st.integers(min_value=0, max_value=MAX_TOKENS)
ts = st.floats(min_value=0, max_value=4e9, allow_nan=False, allow_infinity=False)

TOKEN_FIELDS = {"prompt_tokens", "output_tokens", "result_tokens", "cached_tokens", "prompt_tokens_mean"}
ID_FIELDS = {"traj", "req", "group", "engine", "decode_engine", "tool", "cmd", "server"}


@st.composite
def valid_events(draw: st.DrawFn) -> dict:
    kind = draw(st.sampled_from(sorted(EVENT_TYPES)))
    obj = event(kind, id=draw(ids), run=draw(runs), ts=draw(ts))
    for name in sorted(FULL[kind]):
        if name in TOKEN_FIELDS:
            obj[name] = draw(tokens)
        elif name in ID_FIELDS:
            obj[name] = draw(ids)
        if name in OPTIONAL.get(kind, set()) and draw(st.booleans()):
            obj.pop(name)
    return obj


@settings(max_examples=400, deadline=None)
@given(valid_events())
def test_valid_events_round_trip(obj: dict) -> None:
    ev = decode_event(json.dumps(obj).encode())
    assert ev.type == obj["type"]
    assert decode_event(encode_event(ev)) == ev
    assert event_from_dict(json.loads(encode_event(ev))) == ev


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512))
def test_garbage_never_crashes(data: bytes) -> None:
    try:
        decode_event(data)
    except Exception as exc:  # only the one error type may escape
        from prorsa_schemas import EventError

        assert isinstance(exc, EventError)
        assert exc.reason
