"""verl's LLM client, through the SGLang router in PD mode, with lifecycle events.

verl's own ``LLMServerClient`` picks one of its SGLang servers per trajectory (sticky, by
request id) through a Ray load balancer, so no router sees the requests and a prefill or
decode role switch behind a router would not touch them. :class:`ProrsaLLMServerClient`
sends each of verl's ``generate`` calls as SGLang ``POST /generate`` to the router, which
pairs a prefill and a decode engine per request, and publishes ``request.queued``,
``prefill.finished`` and ``decode.finished`` for the current trajectory
(:func:`~prorsa_sdk.integrations.verl.session.current_trajectory`).

The request body is the one verl's own SGLang server builds (``async_sglang_server.py``
of verl 0.9.1): ``input_ids``, the sampling parameters with ``max_new_tokens`` (given, or
verl's default from ``response_length`` and ``prompt_length``, capped by ``max_model_len``)
and ``return_logprob``. An abort (a weight update, a role switch) is resumed as verl's
partial rollout does: the prompt plus the tokens so far, for the tokens left.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.replica import TokenOutput

from ...wire import EngineAborted, EngineError, Generation
from .session import Session, config_get, current_trajectory

log = logging.getLogger("prorsa_sdk.integrations.verl")

MAX_RETRIES = 8
"""CHOICE: failed sends (router or engine errors, no answer) retried per request before the
error reaches verl; with the backoff below about 13 s in all, longer than a role switch."""
BACKOFF_S = (0.05, 2.0)
"""CHOICE: first and longest wait between retries (doubling): a router without a worker of
a role answers at once, so retrying without a wait would only spin."""
MAX_RESUMES = 16
"""CHOICE: aborts resumed per request (each one resends the prompt and the tokens so far)."""


def sglang_body(rollout: Any, prompt_ids: list[int], sampling_params: dict[str, Any]) -> dict[str, Any]:
    """SGLang's ``/generate`` body for verl's ``generate(prompt_ids, sampling_params)``, as
    verl's SGLang server makes it (``rollout``: ``actor_rollout_ref.rollout`` of the config)."""
    params = dict(sampling_params)
    if "max_new_tokens" in params:
        budget = params.pop("max_new_tokens")
    elif "max_tokens" in params:
        budget = params.pop("max_tokens")
    else:
        budget = min(rollout.response_length, rollout.prompt_length + rollout.response_length - len(prompt_ids))
    max_model_len = getattr(rollout, "max_model_len", None)
    if max_model_len:
        budget = min(budget, max_model_len - len(prompt_ids) - 1)
    params["max_new_tokens"] = max(0, int(budget))
    return_logprob = bool(params.pop("logprobs", False))
    params.pop("prompt_logprobs", None)
    return {"input_ids": list(prompt_ids), "sampling_params": params, "return_logprob": return_logprob}


def _logprobs(gen: Generation) -> list[float] | None:
    meta = gen.body.get("meta_info") or {}
    rows = meta.get("output_token_logprobs") or []
    if len(rows) != len(gen.output_ids):
        return None
    return [float(r[0]) for r in rows]


class ProrsaLLMServerClient(LLMServerClient):
    """verl's LLM client (``LLMServerClient``) that sends through the SGLang router.

    ``config``: verl's whole config. ``max_new_tokens``: a cap on each request's new tokens
    (verl's default lets every turn use the whole ``response_length``). The rest is
    :class:`~.session.Session`'s: the router's URL (or ``$PRORSA_ROUTER_URL``), the run name
    (or ``$PRORSA_RUN``, else the config's ``trainer.experiment_name``), the NATS URL, an
    emitter for this process."""

    def __init__(self, config: Any, load_balancer_handle: Any = None, *, router_url: str | None = None,
                 run: str | None = None, nats_url: str | None = None, namespace: Any = None, emitter: Any = None,
                 session: Session | None = None, max_new_tokens: int | None = None, **kwargs: Any):
        super().__init__(config, load_balancer_handle=None, **kwargs)
        if max_new_tokens is not None and (isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int)
                                           or max_new_tokens < 1):
            raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
        self.max_new_tokens = max_new_tokens
        default_run = str(config_get(config, "trainer", "experiment_name") or "verl")
        self.session = session or Session(router_url, run=run, default_run=default_run, nats_url=nats_url,
                                          namespace=namespace, emitter=emitter)
        self.global_steps: int | None = None
        self._warned = False

    @property
    def rollout(self) -> Any:
        return self.config.actor_rollout_ref.rollout

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       image_data: Any = None, video_data: Any = None, audio_data: Any = None,
                       mm_processor_kwargs: Any = None, **kwargs: Any) -> TokenOutput:
        """One of verl's model requests (the agent loop's ``server_manager.generate``)."""
        if image_data or video_data or audio_data or kwargs.get("mm_processor_output"):
            raise NotImplementedError("ProrsaLLMServerClient sends token ids to the router: multimodal "
                                      "inputs are not supported")
        prompt_ids = [int(t) for t in prompt_ids]
        body = sglang_body(self.rollout, prompt_ids, sampling_params)
        if self.max_new_tokens is not None:
            sp = body["sampling_params"]
            sp["max_new_tokens"] = min(sp["max_new_tokens"], self.max_new_tokens)
        live = current_trajectory()
        if live is None:
            return await self._unobserved(body)
        traj = await live.dispatch(len(prompt_ids))
        tokens: list[int] = []
        logprobs: list[float] | None = [] if body["return_logprob"] else None
        budget = body["sampling_params"]["max_new_tokens"]
        cached = None
        for _ in range(MAX_RESUMES + 1):
            send = {**body, "input_ids": prompt_ids + tokens,
                    "sampling_params": {**body["sampling_params"], "max_new_tokens": budget - len(tokens)}}
            try:
                gen = await self._send(traj, send)
            except EngineAborted as exc:  # resumed: prompt + tokens so far, a new request.queued
                gen = exc.result
                stop = None
            else:
                stop = gen.outcome.finish
            tokens += gen.output_ids
            if logprobs is not None:
                logprobs += _logprobs(gen) or [0.0] * len(gen.output_ids)
            if cached is None:
                cached = gen.outcome.cached_tokens
            if stop is not None:
                break
            if len(tokens) >= budget:
                stop = "length"
                break
        else:
            stop = "abort"
        return self._output(tokens, logprobs, stop, cached)

    async def _send(self, traj: Any, body: dict[str, Any]) -> Generation:
        wait = BACKOFF_S[0]
        for attempt in range(MAX_RETRIES + 1):
            try:
                return await traj.generate({**body})
            except EngineAborted:
                raise
            except EngineError as exc:  # the request stays queued: the next send re-sends it
                if attempt == MAX_RETRIES:
                    raise
                log.warning("request of %s failed (%s); retrying in %.2f s", traj.traj, exc, wait)
                await asyncio.sleep(wait)
                wait = min(BACKOFF_S[1], wait * 2)
        raise AssertionError("unreachable")

    async def _unobserved(self, body: dict[str, Any]) -> TokenOutput:
        """A request outside any trajectory (no ProrsaAgentLoopWorker runs the loop): sent to
        the router, nothing published."""
        if not self._warned:
            self._warned = True
            log.warning("ProrsaLLMServerClient: a request outside a Prorsa trajectory was sent without "
                        "lifecycle events (run the agent loops with ProrsaAgentLoopWorker)")
        http = self.session.client().http
        resp = await http.post(f"{self.session.router_url}/generate", json=body)
        if resp.status_code >= 400:
            raise EngineError(f"router answered HTTP {resp.status_code}: {resp.text[:300]}", resp.status_code)
        out = resp.json()
        meta = out.get("meta_info") or {}
        finish = (meta.get("finish_reason") or {}).get("type")
        ids = [int(t) for t in out.get("output_ids") or []]
        rows = meta.get("output_token_logprobs") or []
        logprobs = [float(r[0]) for r in rows] if body["return_logprob"] and len(rows) == len(ids) else None
        return self._output(ids, logprobs, finish, meta.get("cached_tokens"))

    def _output(self, tokens: list[int], logprobs: list[float] | None, stop: str | None,
                cached: int | None) -> TokenOutput:
        steps = self.global_steps
        extra = {"global_steps": steps, "min_global_steps": steps, "max_global_steps": steps,
                 "num_cached_tokens": cached}
        return TokenOutput(token_ids=tokens, log_probs=logprobs, stop_reason=stop, extra_fields=extra)



__all__ = ["ProrsaLLMServerClient", "sglang_body"]
