"""HTTP adapters: one SGLang instance, and the router's ``/workers`` API (httpx)."""

from __future__ import annotations

from dataclasses import dataclass

import httpx


class EngineHTTPError(RuntimeError):
    """An SGLang or router call failed; the message says which and why."""


@dataclass(frozen=True)
class Load:
    """The sum over DP ranks of ``GET /v1/loads?include=core,disagg``."""

    running: int
    waiting: int
    pd_queued: int
    """Every PD queue (bootstrap, in-flight, prealloc, transfer): SGLang's idle check."""
    used_tokens: int
    capacity_tokens: int
    gen_throughput: float
    cache_hit_rate: float | None
    prefill_computed_total: int | None = None
    """SGLang's cumulative ``total_prefill_uncached_tokens`` (prompt tokens computed, after
    prefix-cache hits) summed over ranks; None when a rank does not report it."""

    prealloc: int = 0
    """Requests a decode engine holds waiting for its own KV (``decode_prealloc_queue_reqs``)."""

    @property
    def queued(self) -> int:
        """Requests waiting for this engine itself: its waiting queue and, on a decode
        engine, the prealloc queue. Not those waiting on the PD peer (a prefill engine's
        bootstrap and in-flight queues wait for the decode side, a decode engine's transfer
        queue for the prefill side's KV): they say nothing of this role's load."""
        return self.waiting + self.prealloc

    @property
    def idle(self) -> bool:
        # SGLang's is_fully_idle also requires the PD queues to be empty.
        return self.running == 0 and self.waiting == 0 and self.pd_queued == 0


_PD_QUEUES = ("prefill_bootstrap_queue_reqs", "prefill_inflight_queue_reqs",
              "decode_prealloc_queue_reqs", "decode_transfer_queue_reqs")


def parse_loads(body: dict) -> Load:
    """Sum the per-rank entries of a ``/v1/loads`` answer."""
    loads = body.get("loads")
    if not isinstance(loads, list) or not loads:
        raise EngineHTTPError(f"/v1/loads answer has no 'loads' list: {str(body)[:200]}")
    pd = sum(int((l.get("disaggregation") or {}).get(q, 0)) for l in loads for q in _PD_QUEUES)
    hits = [float(l["cache_hit_rate"]) for l in loads if l.get("cache_hit_rate") is not None]
    computed = [l.get("total_prefill_uncached_tokens") for l in loads]
    return Load(
        running=sum(int(l.get("num_running_reqs", 0)) for l in loads),
        waiting=sum(int(l.get("num_waiting_reqs", 0)) for l in loads),
        pd_queued=pd,
        prealloc=sum(int((l.get("disaggregation") or {}).get("decode_prealloc_queue_reqs", 0)) for l in loads),
        used_tokens=sum(int(l.get("num_used_tokens", 0)) for l in loads),
        capacity_tokens=sum(int(l.get("max_total_num_tokens", 0)) for l in loads),
        gen_throughput=sum(float(l.get("gen_throughput", 0.0)) for l in loads),
        cache_hit_rate=min(1.0, max(0.0, sum(hits) / len(hits))) if hits else None,
        prefill_computed_total=sum(int(c) for c in computed)
        if all(isinstance(c, (int, float)) and c >= 0 for c in computed) else None,
    )


@dataclass
class CounterRate:
    """The rate of a cumulative counter between two polls: None on the first sample, on a
    counter that went backwards (the engine restarted), on a clock that did not move, and
    across a change of ``tag`` (the engine's role: a rate spanning a switch is neither's)."""

    last: tuple[float, float, str] | None = None  # (counter, monotonic seconds, tag)

    def rate(self, total: float | None, now: float, tag: str = "") -> float | None:
        if total is None:
            self.last = None
            return None
        prev, self.last = self.last, (total, now, tag)
        if prev is None or prev[2] != tag or total < prev[0] or now <= prev[1]:
            return None
        return (total - prev[0]) / (now - prev[1])


class EngineClient:
    """Calls to one SGLang instance."""

    def __init__(self, http: httpx.AsyncClient, url: str):
        self.http = http
        self.url = url

    async def _get(self, path: str, timeout: float = 5.0) -> httpx.Response:
        try:
            return await self.http.get(self.url + path, timeout=timeout)
        except httpx.HTTPError as exc:
            raise EngineHTTPError(f"GET {self.url}{path}: {exc!r}") from None

    async def healthy(self) -> bool:
        try:
            return (await self.http.get(self.url + "/health", timeout=5.0)).status_code == 200
        except httpx.HTTPError:
            return False

    async def role(self) -> str:
        r = await self._get("/model_info")
        if r.status_code != 200:
            raise EngineHTTPError(f"GET {self.url}/model_info: HTTP {r.status_code}")
        mode = r.json().get("disaggregation_mode")
        if mode not in ("prefill", "decode", "null"):
            raise EngineHTTPError(f"{self.url}/model_info: unexpected disaggregation_mode {mode!r}")
        return "mixed" if mode == "null" else mode

    async def loads(self) -> Load:
        r = await self._get("/v1/loads?include=core,disagg")
        if r.status_code != 200:
            raise EngineHTTPError(f"GET {self.url}/v1/loads: HTTP {r.status_code}: {r.text[:200]}")
        return parse_loads(r.json())

    async def model_info(self) -> dict:
        r = await self._get("/model_info")
        if r.status_code != 200:
            raise EngineHTTPError(f"GET {self.url}/model_info: HTTP {r.status_code}")
        body = r.json()
        if not isinstance(body, dict):
            raise EngineHTTPError(f"{self.url}/model_info: not a JSON object")
        return body

    async def ready(self) -> bool | None:
        """``GET /ready``: False while generation is paused (a weight sync); None when the
        engine has no such endpoint or does not answer."""
        try:
            r = await self.http.get(self.url + "/ready", timeout=5.0)
        except httpx.HTTPError:
            return None
        return {200: True, 503: False}.get(r.status_code)

    async def server_info(self) -> dict | None:
        r = await self._get("/server_info")
        if r.status_code != 200:
            return None
        body = r.json()
        return body if isinstance(body, dict) else None

    async def decode_graph_gb(self) -> float | None:
        r = await self._get("/server_info")
        if r.status_code != 200:
            return None
        states = r.json().get("internal_states") or []
        vals = [s.get("decode_cuda_graph_memory_gb") for s in states if isinstance(s, dict)]
        vals = [float(v) for v in vals if isinstance(v, (int, float))]
        return max(vals) if vals else None

    async def abort_all(self) -> None:
        try:
            await self.http.post(self.url + "/abort_request", json={"abort_all": True}, timeout=5.0)
        except httpx.HTTPError as exc:
            raise EngineHTTPError(f"POST {self.url}/abort_request: {exc!r}") from None

    async def role_switch(self, new_role: str, graph_gb: float | None, timeout: float) -> dict:
        """``POST /pd_role_switch``; returns SGLang's body (``success``, ``safe_to_restore``...)."""
        body: dict = {"new_role": new_role}
        if graph_gb is not None:
            body["decode_cuda_graph_memory_gb"] = graph_gb
        try:
            r = await self.http.post(self.url + "/pd_role_switch", json=body, timeout=timeout)
        except httpx.HTTPError as exc:
            # The connection broke mid-call: we cannot know the engine's state.
            return {"success": False, "safe_to_restore": False, "message": f"request failed: {exc!r}"}
        try:
            out = r.json()
        except ValueError:
            out = {}
        if not isinstance(out, dict) or "success" not in out:
            return {"success": False, "safe_to_restore": False,
                    "message": f"HTTP {r.status_code}: {r.text[:200]}"}
        return out


class RouterClient:
    """The router's worker API (sglang-router 0.3.2 / SMG)."""

    def __init__(self, http: httpx.AsyncClient, url: str):
        self.http = http
        self.url = url

    async def workers(self) -> list[dict]:
        try:
            r = await self.http.get(self.url + "/workers", timeout=5.0)
        except httpx.HTTPError as exc:
            raise EngineHTTPError(f"GET {self.url}/workers: {exc!r}") from None
        if r.status_code != 200:
            raise EngineHTTPError(f"GET {self.url}/workers: HTTP {r.status_code}: {r.text[:200]}")
        ws = r.json().get("workers")
        return ws if isinstance(ws, list) else []

    async def find(self, url: str) -> dict | None:
        return next((w for w in await self.workers() if str(w.get("url", "")).rstrip("/") == url), None)

    async def add(self, url: str, worker_type: str, bootstrap_port: int | None) -> None:
        body: dict = {"url": url, "worker_type": worker_type}
        if worker_type == "prefill" and bootstrap_port is not None:
            body["bootstrap_port"] = bootstrap_port
        try:
            r = await self.http.post(self.url + "/workers", json=body, timeout=10.0)
        except httpx.HTTPError as exc:
            raise EngineHTTPError(f"POST {self.url}/workers: {exc!r}") from None
        if r.status_code not in (200, 201, 202, 409):
            raise EngineHTTPError(f"POST {self.url}/workers: HTTP {r.status_code}: {r.text[:200]}")

    async def remove(self, worker_id: str) -> None:
        try:
            r = await self.http.delete(f"{self.url}/workers/{worker_id}", timeout=10.0)
        except httpx.HTTPError as exc:
            raise EngineHTTPError(f"DELETE {self.url}/workers/{worker_id}: {exc!r}") from None
        if r.status_code not in (200, 202, 204, 404):
            raise EngineHTTPError(f"DELETE {self.url}/workers/{worker_id}: HTTP {r.status_code}: {r.text[:200]}")
