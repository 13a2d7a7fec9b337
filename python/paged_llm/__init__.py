"""paged_llm: the paged-attention serving engine from Python, shaped like vLLM's API.

``LLM`` runs offline batches (``generate``, ``chat``, ``embed``; LoRA adapters per request with
``LoRARequest`` and the ``enable_lora=True`` engine argument); ``AsyncLLM`` streams one request at a time
to asyncio (``async for out in llm.generate(...)``; closing the iterator or cancelling the task
aborts the request). Requests take a ``SamplingParams`` and come back as ``RequestOutput``s.
The engine is Rust (``paged_llm._core``): it runs on its own thread, and no call holds the GIL
while it waits for it.

Errors: ``InvalidRequestError`` (a ``ValueError``) for a request refused for what it asks,
``QueueFullError`` when the waiting queue is full, ``EngineError`` (a ``RuntimeError``) when the
engine fails, ``EngineStoppedError`` after ``shutdown``; an unknown engine argument or sampling
field is a ``TypeError`` and a missing model a ``FileNotFoundError``.
"""

from ._core import EngineError, EngineStoppedError, InvalidRequestError, QueueFullError
from .async_llm import AsyncLLM
from .llm import LLM
from .lora import LoRARequest
from .outputs import (
    CompletionOutput,
    EmbeddingOutput,
    EmbeddingRequestOutput,
    Logprob,
    RequestMetrics,
    RequestOutput,
)
from .pooling import PoolingParams
from .sampling import RequestOutputKind, SamplingParams

__all__ = [
    "LLM",
    "AsyncLLM",
    "SamplingParams",
    "RequestOutputKind",
    "RequestOutput",
    "CompletionOutput",
    "Logprob",
    "RequestMetrics",
    "PoolingParams",
    "LoRARequest",
    "EmbeddingOutput",
    "EmbeddingRequestOutput",
    "EngineError",
    "EngineStoppedError",
    "InvalidRequestError",
    "QueueFullError",
]
