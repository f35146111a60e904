"""What an engine's answer says about a model request: pure functions, no I/O.

An :class:`Outcome` is read from an SGLang ``/generate`` answer (``meta_info``) or an
OpenAI-compatible ``/v1/chat/completions`` / ``/v1/completions`` answer (``usage``), whole
or streamed. Times are on the caller's clock: ``sent`` (the request left) and
``received`` (the answer, or its last chunk, arrived).

The first-token time (the end of prefill: the decode admission) comes from, in order:

1. the first streamed chunk (``stream=True``): the time it arrived;
2. SGLang's ``meta_info`` timestamps, present when the server runs with
   ``--enable-metrics``: ``request_received_ts``, ``request_finished_ts`` and
   ``decode_throughput`` (= completion_tokens / (finished - first token)) give the
   server's time to first token; else ``prefill_finished_time`` - ``request_received_ts``.
   The difference is taken on the server's clock and added to ``sent`` on the caller's,
   so a clock offset between the hosts does not matter;
3. nothing: ``first_token_ts`` is None and the caller uses ``received`` (an upper bound).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

Finish = Literal["stop", "length", "abort", "tool"]

_SGLANG_FINISH: dict[str, Finish] = {"stop": "stop", "length": "length", "abort": "abort"}
_OPENAI_FINISH: dict[str, Finish] = {
    "stop": "stop", "length": "length", "abort": "abort", "tool_calls": "tool", "function_call": "tool",
    "content_filter": "stop",
}


class ResponseError(ValueError):
    """The engine's answer is not the shape SGLang or the OpenAI API documents."""


@dataclass(frozen=True)
class Outcome:
    """What one model request produced, as the lifecycle events need it."""

    output_tokens: int
    finish: Finish
    """``stop``, ``length``, ``abort``, or ``tool`` when the API itself says tool_calls."""
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    first_token_ts: float | None = None
    """When the first output token came out (caller's clock), if the answer tells."""
    message: str | None = None
    """The engine's words on an abort."""


def _count(value: object, where: str, *, required: bool = True) -> int | None:
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ResponseError(f"{where}: expected a token count (int >= 0), got {value!r}")
    return value


def _number(meta: Mapping[str, Any], key: str) -> float | None:
    v = meta.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _clamp(ts: float, sent: float, received: float) -> float:
    return min(max(ts, sent), max(sent, received))


def server_ttft(meta: Mapping[str, Any]) -> float | None:
    """Seconds from the server receiving the request to its first output token, when
    ``meta_info`` carries the ``--enable-metrics`` timestamps; else None."""
    recv = _number(meta, "request_received_ts")
    if recv is None:
        return None
    done, rate = _number(meta, "request_finished_ts"), _number(meta, "decode_throughput")
    tokens = meta.get("completion_tokens")
    if done is not None and rate and rate > 0 and isinstance(tokens, int) and tokens > 0:
        return max(0.0, done - tokens / rate - recv)
    prefill = _number(meta, "prefill_finished_time")
    if prefill is not None:
        return max(0.0, prefill - recv)
    return None


def sglang_outcome(body: object, sent: float, received: float, first_chunk: float | None = None) -> Outcome:
    """The outcome of an SGLang ``/generate`` answer (the whole JSON, or the last streamed chunk)."""
    if not isinstance(body, Mapping) or not isinstance(body.get("meta_info"), Mapping):
        raise ResponseError(f"SGLang answer without a meta_info object: {_short(body)}")
    meta = body["meta_info"]
    reason = meta.get("finish_reason")
    kind = reason.get("type") if isinstance(reason, Mapping) else reason
    if kind not in _SGLANG_FINISH:
        raise ResponseError(f"meta_info.finish_reason: expected type stop, length or abort, got {reason!r}")
    first = first_chunk
    if first is None:
        ttft = server_ttft(meta)
        first = None if ttft is None else _clamp(sent + ttft, sent, received)
    message = reason.get("message") if isinstance(reason, Mapping) else None
    return Outcome(
        output_tokens=_count(meta.get("completion_tokens"), "meta_info.completion_tokens"),  # type: ignore[arg-type]
        finish=_SGLANG_FINISH[kind],
        prompt_tokens=_count(meta.get("prompt_tokens"), "meta_info.prompt_tokens", required=False),
        cached_tokens=_count(meta.get("cached_tokens"), "meta_info.cached_tokens", required=False),
        first_token_ts=first,
        message=message if isinstance(message, str) else None,
    )


def openai_outcome(body: object, chunks: Iterable[Mapping[str, Any]] = (), first_chunk: float | None = None) -> Outcome:
    """The outcome of an OpenAI-compatible answer: ``body`` is the whole JSON; when streamed,
    ``body`` is None and ``chunks`` are the parsed ``data:`` chunks (the usage chunk last,
    as ``stream_options.include_usage`` makes it)."""
    usage: object = None
    finish: object = None
    if body is not None:
        if not isinstance(body, Mapping) or not isinstance(body.get("choices"), list) or not body["choices"]:
            raise ResponseError(f"OpenAI answer without choices: {_short(body)}")
        choice = body["choices"][0]
        finish = choice.get("finish_reason") if isinstance(choice, Mapping) else None
        usage = body.get("usage")
    else:
        for c in chunks:
            for choice in c.get("choices") or []:
                if isinstance(choice, Mapping) and choice.get("finish_reason") is not None:
                    finish = choice["finish_reason"]
            if isinstance(c.get("usage"), Mapping):
                usage = c["usage"]
    if finish not in _OPENAI_FINISH:
        raise ResponseError(f"choices[0].finish_reason: expected stop, length, tool_calls or abort, got {finish!r}")
    if not isinstance(usage, Mapping):
        raise ResponseError("OpenAI answer without usage (streamed: send stream_options.include_usage)")
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    return Outcome(
        output_tokens=_count(usage.get("completion_tokens"), "usage.completion_tokens"),  # type: ignore[arg-type]
        finish=_OPENAI_FINISH[finish],  # type: ignore[index]
        prompt_tokens=_count(usage.get("prompt_tokens"), "usage.prompt_tokens", required=False),
        cached_tokens=_count(cached, "usage.prompt_tokens_details.cached_tokens", required=False),
        first_token_ts=first_chunk,
    )


def sse_data(line: str) -> dict | None:
    """The JSON object of one server-sent-events line (``data: {...}``); None for other
    lines and for ``data: [DONE]``."""
    if not line.startswith("data:"):
        return None
    payload = line[5:].strip()
    if not payload or payload == "[DONE]":
        return None
    try:
        obj = json.loads(payload)
    except ValueError:
        raise ResponseError(f"streamed chunk is not JSON: {_short(payload)}") from None
    if not isinstance(obj, dict):
        raise ResponseError(f"streamed chunk is not a JSON object: {_short(payload)}")
    if "error" in obj and "choices" not in obj and "meta_info" not in obj:
        raise ResponseError(f"engine error in the stream: {_short(obj['error'])}")
    return obj


def is_first_token_chunk(chunk: Mapping[str, Any], api: Literal["sglang", "openai"]) -> bool:
    """Whether a streamed chunk carries output (its arrival is the first-token time)."""
    if api == "sglang":
        meta = chunk.get("meta_info")
        n = meta.get("completion_tokens") if isinstance(meta, Mapping) else None
        return bool(n) or bool(chunk.get("text")) or bool(chunk.get("output_ids"))
    return bool(chunk.get("choices"))


def _short(obj: object, n: int = 200) -> str:
    s = obj if isinstance(obj, str) else repr(obj)
    return s if len(s) <= n else s[:n] + "..."
