"""What the async and the sync client share: request bodies, prompt lengths, errors, the
result of one model request and how it is read from an answer. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from .outcome import Outcome, ResponseError, openai_outcome, sglang_outcome

Api = Literal["sglang", "openai"]
TokenCounter = Callable[[Mapping[str, Any]], int]

GENERATE = "/generate"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


class EngineError(RuntimeError):
    """The engine (or the router in front of it) refused or failed a model request: an HTTP
    error status, a broken connection, or an answer that is not SGLang's or OpenAI's shape.
    The request stays queued in the trajectory: calling the same method again re-sends it."""

    def __init__(self, message: str, status: int | None = None, body: str | None = None):
        super().__init__(message)
        self.status = status
        self.body = body


class EngineAborted(EngineError):
    """The engine aborted the request (``finish_reason`` abort), e.g. for a weight update.
    ``decode.finished(abort)`` is published when the prefill had run; the next request of
    the trajectory is a re-prefill (a new ``request.queued``)."""

    def __init__(self, message: str, outcome: Outcome, result: "Generation"):
        super().__init__(message)
        self.outcome = outcome
        self.result = result


@dataclass
class Generation:
    """One answered model request."""

    req: str
    turn: int
    api: Api
    body: dict
    """The JSON answer; streamed: the last chunk (SGLang: it carries meta_info)."""
    outcome: Outcome
    chunks: list[dict] = field(default_factory=list)
    """Streamed: every ``data:`` chunk, in order."""

    @property
    def text(self) -> str:
        """The output text (OpenAI chat: the message content; streamed: the deltas joined)."""
        if self.api == "sglang":
            t = self.body.get("text")
            return t if isinstance(t, str) else ""
        if self.chunks:
            parts = []
            for c in self.chunks:
                for ch in c.get("choices") or []:
                    piece = (ch.get("delta") or {}).get("content") if "delta" in ch else ch.get("text")
                    if isinstance(piece, str):
                        parts.append(piece)
            return "".join(parts)
        ch = self.body["choices"][0]
        if isinstance(ch.get("message"), Mapping):
            return ch["message"].get("content") or ""
        return ch.get("text") or ""

    @property
    def output_ids(self) -> list[int]:
        """SGLang's ``output_ids`` (empty for the OpenAI API)."""
        ids = self.body.get("output_ids") if self.api == "sglang" else None
        return list(ids) if isinstance(ids, list) else []

    @property
    def tool_calls(self) -> list:
        """OpenAI chat ``tool_calls`` of the answer (whole answers only)."""
        if self.api != "openai" or self.chunks:
            return []
        msg = self.body["choices"][0].get("message")
        calls = msg.get("tool_calls") if isinstance(msg, Mapping) else None
        return list(calls) if isinstance(calls, list) else []


def prompt_length(body: Mapping[str, Any], prompt_tokens: int | None, counter: TokenCounter | None) -> int:
    """The FULL prompt length ``request.queued`` needs, known before sending: given, or the
    length of ``input_ids``, or what the client's ``count_tokens`` says."""
    if prompt_tokens is not None:
        return prompt_tokens
    ids = body.get("input_ids")
    if isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids):
        return len(ids)
    if counter is not None:
        return counter(body)
    raise ValueError(
        "the prompt's length is needed before sending (request.queued carries it): pass prompt_tokens=, "
        "send input_ids, or give the client count_tokens= (e.g. your tokenizer's apply_chat_template)")


def openai_stream_body(body: dict[str, Any]) -> dict[str, Any]:
    """A streamed OpenAI body asks for the usage chunk (the token counts come only there)."""
    opts = dict(body.get("stream_options") or {})
    opts.setdefault("include_usage", True)
    return {**body, "stream": True, "stream_options": opts}


def error_text(status: int, text: str) -> str:
    return f"engine answered HTTP {status}: {text[:300]}"


def response_json(resp: Any) -> object:
    """The JSON of a whole answer (an ``httpx.Response``), or :class:`ResponseError`."""
    try:
        return resp.json()
    except ValueError:
        raise ResponseError(f"engine answer is not JSON: {resp.text[:200]!r}") from None


def whole_generation(api: Api, req: str, turn: int, body: object, sent: float, received: float) -> Generation:
    """The :class:`Generation` of a whole (not streamed) answer."""
    out = sglang_outcome(body, sent, received) if api == "sglang" else openai_outcome(body)
    return Generation(req, turn, api, body, out)  # type: ignore[arg-type]


def streamed_generation(api: Api, req: str, turn: int, chunks: list[dict], sent: float, received: float,
                        first: float | None) -> Generation:
    """The :class:`Generation` of a streamed answer: its ``data:`` chunks, in order; ``first``:
    when the first token came."""
    if api == "sglang":
        last = next((c for c in reversed(chunks) if isinstance(c.get("meta_info"), dict)), None)
        return Generation(req, turn, api, last or {}, sglang_outcome(last, sent, received, first), chunks)
    out = openai_outcome(None, chunks, first)
    return Generation(req, turn, api, chunks[-1] if chunks else {}, out, chunks)


__all__ = [
    "CHAT", "COMPLETIONS", "GENERATE", "Api", "EngineAborted", "EngineError", "Generation", "ResponseError",
    "TokenCounter", "error_text", "openai_stream_body", "prompt_length", "response_json", "streamed_generation",
    "whole_generation",
]
