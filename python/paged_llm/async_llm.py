"""``AsyncLLM``: one request at a time for asyncio, streamed.
``async for out in llm.generate(prompt, params)`` yields ``RequestOutput``s as the engine makes
them (``params.output_kind``: everything so far, only what is new, or only the end). Leaving
the loop early, ``aclose()``, or cancelling the task aborts the request in the engine, which
frees its KV blocks at its next step.
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator, Dict, List, Optional, Sequence

from ._client import (
    PromptType,
    _Client,
    _conversation_json,
    _flat_metrics,
    _output_kind,
    _params_json,
    _prompt_json,
)
from .lora import LoRARequest
from .outputs import RequestOutput
from .sampling import SamplingParams


class AsyncLLM(_Client):
    """A model loaded for serving from asyncio: ``AsyncLLM("smollm2")``.

    Waiting for outputs holds neither the GIL nor the event loop; many requests stream at
    once and share the engine's batches.
    """

    # `generate` and `chat` return `_stream`'s generator itself rather than wrapping it in one
    # of their own: closing a wrapper would leave the inner generator (and its request) to the
    # garbage collector, while this way `aclose()` reaches the `finally` that aborts at once.

    def generate(
        self,
        prompt: PromptType,
        sampling_params: Optional[SamplingParams] = None,
        request_id: Optional[str] = None,
        *,
        priority: int = 0,
        cache_salt: Optional[str] = None,
        lora_request: Optional[LoRARequest] = None,
    ) -> AsyncIterator[RequestOutput]:
        """Streams one request's outputs; the last has ``finished`` set. ``request_id``:
        for ``abort``; one is made up when ``None``. ``priority`` counts under the
        ``scheduling_policy="priority"`` engine argument; ``cache_salt`` keeps the request's
        prefix-cache entries to requests with the same salt; ``lora_request``: the adapter it
        runs under."""
        return self._stream(_prompt_json(prompt), sampling_params, request_id, priority, cache_salt, lora_request)

    def chat(
        self,
        messages: Sequence[Dict[str, Any]],
        sampling_params: Optional[SamplingParams] = None,
        request_id: Optional[str] = None,
        *,
        tools: Optional[List[Dict[str, Any]]] = None,
        documents: Optional[List[Dict[str, Any]]] = None,
        chat_template_kwargs: Optional[Dict[str, Any]] = None,
    ) -> AsyncIterator[RequestOutput]:
        """``generate`` for a conversation rendered with the model's chat template."""
        prompt = _conversation_json(messages, tools, documents, chat_template_kwargs)
        return self._stream(prompt, sampling_params, request_id, 0, None, None)

    async def abort(self, request_id: str) -> bool:
        """Aborts an unfinished request; False when there is none by that id."""
        return self._engine.abort(request_id)

    async def metrics(self) -> Dict[str, Any]:
        """The engine's metrics between two steps (see ``LLM.metrics``), awaited."""
        return _flat_metrics(await self._engine.metrics_async())

    async def _stream(
        self,
        prompt: str,
        params: Optional[SamplingParams],
        request_id: Optional[str],
        priority: int,
        cache_salt: Optional[str],
        lora_request: Optional[LoRARequest],
    ) -> AsyncIterator[RequestOutput]:
        options = {
            "request_id": request_id,
            "output_kind": _output_kind(params),
            "priority": priority,
            "cache_salt": cache_salt,
            "lora": lora_request._fields() if lora_request else None,
        }
        stream = self._engine.submit(prompt, _params_json(params), json.dumps(options))
        finished = False
        try:
            while True:
                raw = await stream.next()
                if raw is None:
                    return
                out = RequestOutput._from_json(raw)
                finished = out.finished
                yield out
        finally:
            # Reached early by aclose(), a break out of the loop or a cancelled task.
            if not finished:
                stream.abort()
