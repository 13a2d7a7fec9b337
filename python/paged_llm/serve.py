"""The engine on Ray Serve: a deployment of N replicas, each one engine answering the ``server``
crate's OpenAI-compatible API in process (``_core.HttpApp``: the same router ``cargo xtask
serve`` runs, so a replica answers exactly as that server does), behind an ingress that
forwards each HTTP request to a replica through a ``DeploymentHandle``.

- Routing: ``routing="prefix"`` (``_routing.PrefixAffinityRouter``), ``"events"``
  (``_routing.KvEventsRouter``: each replica publishes its KV cache events on a free port of
  its node and reports the address in its routing stats; the router follows them), ``"round_robin"``,
  or ``"power_of_two"`` (Serve's default).
- Failover: a request whose replica died before the ingress passed anything on to the client
  (a whole non-streaming response, or a stream's first event) is sent again, to a live replica;
  a stream that already began ends early instead, as a duplicated prefix would corrupt it.
- Health: Serve calls each replica's ``check_health``, which asks the router's ``/health`` and
  the engine thread's metrics; a replica that fails it, or whose actor dies, is replaced.
- ``GET /replicas/metrics``: every replica's Prometheus text, by replica id (per-replica
  figures such as the prefix cache's hits).

``build_app(model, ...)`` returns the application for ``serve.run``; Ray is imported only when a
function here needs it, so ``paged_llm`` itself does not depend on Ray.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Dict, List, Optional, Tuple, Union

from . import _core
from .models import resolve_model

#: Response header naming the replica that answered.
REPLICA_HEADER = "x-paged-llm-replica"
#: Response header counting the replicas the request was sent to (more than one: failed over).
ATTEMPTS_HEADER = "x-paged-llm-attempts"
#: Request headers the ingress does not pass on (the connection's, not the request's).
_HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}
#: Names accepted by ``build_app(routing=...)``.
ROUTERS = ("prefix", "events", "round_robin", "power_of_two")


@dataclass
class ForwardedRequest:
    """One HTTP request on its way to a replica. ``prompt``: the text the router compares
    (a completion's prompt, or a conversation's messages joined); ``replica``: a full replica
    id when the request must go to that replica."""

    method: str
    path: str
    headers: List[Tuple[str, str]]
    body: bytes
    prompt: str = ""
    replica: Optional[str] = None


@dataclass
class ResponseHead:
    """What a replica sends before the body."""

    status: int
    headers: List[Tuple[str, str]] = field(default_factory=list)
    replica: str = ""


def prompt_text(path: str, body: bytes) -> str:
    """The text of a completion or chat request that prefix routing compares ('' for others)."""
    if not path.startswith(("/v1/completions", "/v1/chat/completions")):
        return ""
    try:
        request = json.loads(body)
    except ValueError:
        return ""
    if not isinstance(request, dict):
        return ""
    prompt = request.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        return prompt[0]
    parts: List[str] = []
    for message in request.get("messages") or []:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        parts.append(f"{message.get('role', '')}:{content or ''}\n")
    return "".join(parts)


class LLMServer:
    """A replica: one engine and the OpenAI-compatible router over it."""

    def __init__(self, model: str, engine_args: Optional[Dict[str, Any]] = None) -> None:
        engine_args = dict(engine_args or {})
        events = engine_args.get("kv_events_config")
        if isinstance(events, dict) and events.get("endpoint") == "auto":
            # `build_app(routing="events")`'s default: free ports of this node's address.
            host = _node_ip()
            events = {"replay_endpoint": f"tcp://{host}:0", "topic": "kv-events", **events, "endpoint": f"tcp://{host}:0"}
            engine_args["kv_events_config"] = events
        #: The topic the replica's events go out under (vLLM's default: none).
        self._events_topic = events.get("topic", "") if isinstance(events, dict) else ""
        args = json.dumps(engine_args, default=os.fspath)
        self._engine = _core.Engine(resolve_model(model), args)
        self._app = _core.HttpApp(self._engine)
        self._id = _replica_id()

    async def handle(self, request: ForwardedRequest) -> AsyncIterator[Union[ResponseHead, bytes]]:
        """The response: its ``ResponseHead``, then the body's chunks (one per SSE event)."""
        status, headers, body = await self._app.call(request.method, request.path, request.headers, request.body)
        try:
            yield ResponseHead(status, headers, self._id)
            while True:
                chunk = await body.next()
                if chunk is None:
                    return
                yield chunk
        finally:
            # Reached when the ingress stops reading: dropping the body aborts its requests.
            body.close()

    async def record_routing_stats(self) -> Dict[str, Any]:
        """What the router weighs (Serve polls it): KV usage, queue, the KV events publisher's
        addresses when it has one, and each LoRA adapter's id (what its blocks' events carry)."""
        from ._client import _flat_metrics

        metrics = _flat_metrics(await self._engine.metrics_async())
        stats: Dict[str, Any] = {k: metrics.get(k, 0) for k in ("kv_usage", "num_running", "num_waiting")}
        endpoints = self._engine.kv_events_endpoints()
        if endpoints is not None:
            stats["kv_events_endpoint"], stats["kv_events_replay"] = endpoints
            stats["kv_events_topic"] = self._events_topic
        stats["lora_ids"] = self._engine.lora_ids()
        return stats

    async def check_health(self) -> None:
        """Raises unless the router answers ``/health`` and the engine thread takes requests."""
        status, _, body = await self._app.call("GET", "/health", [], b"")
        body.close()
        if status != 200:
            raise RuntimeError(f"/health answered {status}")
        await self._engine.metrics_async()

    def __del__(self) -> None:
        engine = getattr(self, "_engine", None)
        if engine is not None:
            engine.shutdown()


def _node_ip() -> str:
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:  # outside Ray
        return "127.0.0.1"


def _replica_id() -> str:
    try:
        from ray import serve

        return serve.get_replica_context().replica_id.to_full_id_str()
    except Exception:  # outside a Serve replica (tests of the class alone)
        return ""


class OpenAIIngress:
    """The HTTP ingress: forwards every request to an ``LLMServer`` replica and its response
    back, sending again what a dead replica dropped before anything reached the client."""

    def __init__(self, llm: Any, max_attempts: int = 5) -> None:
        self._llm = llm
        self._max_attempts = max_attempts

    async def __call__(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        body = await request.body()
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        if request.url.path == "/replicas/metrics":
            return JSONResponse(await self.replica_metrics())
        if request.url.path == "/replicas/kv_index":
            from ._routing import indexed_blocks

            return JSONResponse(indexed_blocks(self._llm.deployment_name))
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS]
        forwarded = ForwardedRequest(request.method, path, headers, body, prompt_text(request.url.path, body))
        return await self._respond(forwarded)

    async def replica_metrics(self) -> Dict[str, str]:
        """Each replica's ``/metrics`` text by its id, read through pinned requests."""
        from ._routing import known_replicas

        ids = known_replicas(self._llm.deployment_name)
        if not ids:
            # The router learns the replicas with its first request.
            await self._respond(ForwardedRequest("GET", "/health", [], b""))
            ids = known_replicas(self._llm.deployment_name)
        texts = {}
        for rid in ids:
            pinned = ForwardedRequest("GET", "/metrics", [], b"", replica=rid)
            head, chunks, _, _ = await self._open(pinned, buffer_all=True)
            if head.replica == rid:
                texts[rid] = b"".join(chunks).decode()
        return texts

    async def _respond(self, forwarded: ForwardedRequest) -> Any:
        from starlette.responses import Response, StreamingResponse

        head, chunks, rest, attempts = await self._open(forwarded, buffer_all=False)
        headers = {k: v for k, v in head.headers if k.lower() not in _HOP_HEADERS}
        headers[REPLICA_HEADER] = head.replica
        headers[ATTEMPTS_HEADER] = str(attempts)
        if rest is None:
            return Response(b"".join(chunks), status_code=head.status, headers=headers)

        async def body() -> AsyncIterator[bytes]:
            for chunk in chunks:
                yield chunk
            async for chunk in rest:
                yield chunk

        return StreamingResponse(body(), status_code=head.status, headers=headers)

    async def _open(
        self, forwarded: ForwardedRequest, buffer_all: bool
    ) -> Tuple[ResponseHead, List[bytes], Any, int]:
        """Sends ``forwarded`` until a replica's response is safe to pass on: its head and whole
        body (any response but an event stream, and everything when ``buffer_all``), or an event
        stream's head and first event. Returns the head, the chunks read, the stream's
        remaining generator (``None`` when the body was read whole) and the attempts made."""
        from ray.exceptions import RayError, RayTaskError

        for attempt in range(self._max_attempts):
            gen = self._llm.options(stream=True).handle.remote(forwarded)
            try:
                head = await gen.__anext__()
                streaming = not buffer_all and _is_event_stream(head.headers)
                chunks: List[bytes] = []
                async for chunk in gen:
                    chunks.append(chunk)
                    if streaming:
                        return head, chunks, gen, attempt + 1
                return head, chunks, None, attempt + 1
            except RayTaskError:
                raise
            except RayError:
                # The replica died (or became unreachable) before anything was passed on.
                gen.cancel()
                if attempt + 1 == self._max_attempts:
                    raise
                await asyncio.sleep(0.25 * (attempt + 1))
        raise AssertionError("unreachable")


def _is_event_stream(headers: List[Tuple[str, str]]) -> bool:
    return any(k.lower() == "content-type" and v.startswith("text/event-stream") for k, v in headers)


def build_app(
    model: str,
    *,
    engine_args: Optional[Dict[str, Any]] = None,
    num_replicas: int = 2,
    routing: str = "prefix",
    max_ongoing_requests: int = 64,
    replica_cpus: float = 0.0,
    health_check_period_s: float = 2.0,
) -> Any:
    """The application for ``serve.run``: ``num_replicas`` replicas of ``model`` (each one
    engine with ``engine_args``) routed by ``routing`` (one of ``ROUTERS``), behind the
    ingress. ``replica_cpus``: the CPUs a replica reserves (the engine runs on threads of its
    own; 0 lets replicas share a small cluster)."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    if routing not in ROUTERS:
        raise ValueError(f"routing must be one of {ROUTERS}, not {routing!r}")
    options: Dict[str, Any] = {}
    engine_args = dict(engine_args or {})
    if routing == "events":
        from . import _routing

        # Each replica binds a free port of its node's address (reported in its routing stats).
        engine_args.setdefault("kv_events_config", {"enable_kv_cache_events": True, "endpoint": "auto"})
        options["request_router_config"] = RequestRouterConfig(
            request_router_class=_routing.KvEventsRouter,
            request_router_kwargs={"model": str(resolve_model(model))},
            request_routing_stats_period_s=1.0,
            request_routing_stats_timeout_s=5.0,
        )
    elif routing != "power_of_two":
        from . import _routing

        router = _routing.PrefixAffinityRouter if routing == "prefix" else _routing.RoundRobinRouter
        options["request_router_config"] = RequestRouterConfig(request_router_class=router)
    replica = serve.deployment(
        name="LLMServer",
        num_replicas=num_replicas,
        max_ongoing_requests=max_ongoing_requests,
        ray_actor_options={"num_cpus": replica_cpus},
        health_check_period_s=health_check_period_s,
        **options,
    )(LLMServer)
    ingress = serve.deployment(
        name="OpenAIIngress",
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=max(1000, 4 * num_replicas * max_ongoing_requests),
    )(OpenAIIngress)
    return ingress.bind(replica.bind(model, engine_args))
