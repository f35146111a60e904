"""Reading engine answers (pure): SGLang meta_info, OpenAI usage, streamed chunks, bad shapes."""

from __future__ import annotations

import pytest

from prorsa_sdk.lifecycle import LifecycleError, TrajectoryCore
from prorsa_sdk.outcome import Outcome, ResponseError, openai_outcome, server_ttft, sglang_outcome, sse_data

# The meta_info of an SGLang 0.5 server started with --enable-metrics (tokenizer_manager.py:
# request_received_ts / request_finished_ts / decode_throughput; req_time_stats.py:
# prefill_finished_time, queue_time, ...): received at 1000.0, first token at 1000.5,
# 40 tokens decoded in 2.0 s, finished at 1002.5 (the server's clock).
META = {
    "id": "r1", "finish_reason": {"type": "stop", "matched": 2}, "prompt_tokens": 812, "completion_tokens": 40,
    "cached_tokens": 512, "e2e_latency": 2.5, "weight_version": "default", "request_received_ts": 1000.0,
    "request_finished_ts": 1002.5, "decode_throughput": 20.0, "prefill_finished_time": 1000.45,
    "queue_time": 0.1,
}


def test_sglang_first_token_time_comes_from_the_servers_clock_difference_not_its_clock():
    # The caller's clock is 50 s behind the server's: only the difference counts.
    out = sglang_outcome({"text": "x", "meta_info": META}, sent=950.0, received=952.6)
    assert out == Outcome(output_tokens=40, finish="stop", prompt_tokens=812, cached_tokens=512,
                          first_token_ts=pytest.approx(950.5))
    assert server_ttft(META) == pytest.approx(0.5)
    # Without decode_throughput, prefill_finished_time is used.
    meta = {k: v for k, v in META.items() if k != "decode_throughput"}
    assert server_ttft(meta) == pytest.approx(0.45)
    # Without the metrics timestamps the answer does not say: the caller uses the answer's time.
    plain = {k: META[k] for k in ("id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens",
                                  "e2e_latency")}
    assert sglang_outcome({"meta_info": plain}, 950.0, 952.6).first_token_ts is None
    # A first-token time outside [sent, received] is clamped into it.
    assert sglang_outcome({"meta_info": META}, sent=950.0, received=950.2).first_token_ts == 950.2


def test_sglang_finish_reasons_and_bad_answers():
    abort = dict(META, finish_reason={"type": "abort", "message": "Abort in waiting queue"}, completion_tokens=0)
    out = sglang_outcome({"meta_info": abort}, 0.0, 1.0)
    assert out.finish == "abort" and out.message == "Abort in waiting queue"
    assert sglang_outcome({"meta_info": dict(META, finish_reason={"type": "length"})}, 0, 1).finish == "length"
    with pytest.raises(ResponseError, match="meta_info"):
        sglang_outcome({"text": "no meta"}, 0, 1)
    with pytest.raises(ResponseError, match="finish_reason"):
        sglang_outcome({"meta_info": dict(META, finish_reason={"type": "weird"})}, 0, 1)
    with pytest.raises(ResponseError, match="completion_tokens"):
        sglang_outcome({"meta_info": dict(META, completion_tokens=-3)}, 0, 1)


def test_openai_whole_and_streamed():
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": None, "tool_calls": [{}]},
                         "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 90, "completion_tokens": 12, "prompt_tokens_details": {"cached_tokens": 64}}}
    assert openai_outcome(body) == Outcome(output_tokens=12, finish="tool", prompt_tokens=90, cached_tokens=64)
    chunks = [{"choices": [{"delta": {"content": "a"}, "finish_reason": None}]},
              {"choices": [{"delta": {}, "finish_reason": "length"}]},
              {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3}}]
    assert openai_outcome(None, chunks, first_chunk=5.0) == Outcome(3, "length", 9, None, 5.0)
    with pytest.raises(ResponseError, match="include_usage"):
        openai_outcome(None, chunks[:2])
    with pytest.raises(ResponseError, match="choices"):
        openai_outcome({"error": "x"})
    assert sse_data("data: [DONE]") is None and sse_data(": keep-alive") is None
    assert sse_data('data: {"choices": []}') == {"choices": []}
    with pytest.raises(ResponseError, match="not JSON"):
        sse_data("data: {oops")
    with pytest.raises(ResponseError, match="engine error"):
        sse_data('data: {"error": {"message": "boom"}}')


def _types(calls):
    return [c.method for c in calls]


def test_core_holds_an_undecided_finish_until_the_next_step_tells():
    core = TrajectoryCore("t")
    assert _types(core.dispatched(100, 0.0)) == ["dispatched"]
    req, turn, calls = core.queue(100, 1.0)
    assert (req, turn, _types(calls)) == ("t:1", 0, ["request_queued"])
    calls = core.answered(req, Outcome(10, "stop"), 2.0)
    assert _types(calls) == ["prefill_finished"] and calls[0].kwargs["ts"] == 2.0  # no first-token time known
    # The next step is a tool: the held answer was a tool call, published with its own time.
    calls = core.tool_started(3.0, tool="search")
    assert _types(calls) == ["decode_finished", "tool_started"]
    assert calls[0].args == ("t", "t:1", 10, "tool") and calls[0].kwargs == {"ts": 2.0}
    assert _types(core.tool_finished(7, 4.0, ok=True)) == ["tool_finished"]
    req, turn, _ = core.queue(117, 5.0)
    assert (req, turn) == ("t:2", 1)
    calls = core.answered(req, Outcome(5, "length", first_token_ts=5.5), 6.0)
    assert calls[0].kwargs["ts"] == 5.5
    # The next step is the reward: the held answer ends the trajectory's turns.
    calls = core.reward_finished(True, 7.0, reward=1.0)
    assert _types(calls) == ["decode_finished", "reward_finished"] and calls[0].args[3] == "length"
    assert not core.live
    with pytest.raises(LifecycleError, match="done"):
        core.queue(1, 8.0)


def test_core_failures_keep_the_request_queued_and_aborts_re_prefill():
    core = TrajectoryCore("t")
    core.dispatched(10, 0.0)
    req, _, _ = core.queue(10, 1.0)
    with pytest.raises(LifecycleError, match="still being answered"):
        core.queue(10, 1.2)  # one request at a time per trajectory
    assert core.failed(req, 1.5) == []  # HTTP 5xx: nothing to publish, still queued
    again, _, calls = core.queue(10, 2.0)
    assert again == req and calls == []  # the retry re-sends the same request
    # Aborted while waiting (no token, no prefill): still queued, nothing published.
    assert core.answered(req, Outcome(0, "abort"), 2.5) == []
    # Aborted mid-decode: prefill.finished then decode.finished(abort); the next request re-prefills.
    calls = core.answered(req, Outcome(4, "abort", first_token_ts=2.8), 3.0)
    assert _types(calls) == ["prefill_finished", "decode_finished"] and calls[1].args[3] == "abort"
    req2, turn, calls = core.queue(14, 3.5)
    assert req2 == "t:2" and turn == 0 and _types(calls) == ["request_queued"]
    with pytest.raises(LifecycleError, match="reward follows"):
        core.reward_started(4.0)
    assert _types(core.dropped("error", 5.0)) == ["dropped"]
