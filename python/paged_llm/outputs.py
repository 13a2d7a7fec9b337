"""What a request yields, shaped like vLLM's: ``RequestOutput`` with one ``CompletionOutput``
per sample (``text``, ``token_ids``, ``cumulative_logprob``, ``logprobs``, ``finish_reason``,
``stop_reason``), ``Logprob`` entries and ``RequestMetrics``. Plain dataclasses, so they pickle
(a Ray actor returns them as they are).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

#: One position's logprobs: token id to its ``Logprob`` (the chosen token and the top ones).
PositionLogprobs = Dict[int, "Logprob"]


@dataclass
class Logprob:
    logprob: float
    #: 1 for the most likely token.
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: List[int]
    cumulative_logprob: Optional[float] = None
    #: One dict per generated token, when the request asked for ``logprobs``.
    logprobs: Optional[List[PositionLogprobs]] = None
    #: ``"stop"``, ``"length"`` or ``"abort"`` once the sample finished, else ``None``.
    finish_reason: Optional[str] = None
    #: The stop string or stop token id that ended the sample (``None`` for end-of-sequence).
    stop_reason: Union[int, str, None] = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    """Seconds since the request arrived (``None`` where it has not happened yet)."""

    time_to_first_token: Optional[float] = None
    latency: Optional[float] = None
    queue_time: Optional[float] = None


@dataclass
class RequestOutput:
    request_id: str
    #: The prompt's text (a conversation's as its chat template rendered it; ``None`` for ids).
    prompt: Optional[str]
    prompt_token_ids: List[int]
    outputs: List[CompletionOutput]
    finished: bool
    #: With ``prompt_logprobs``: ``None`` for the first prompt token, then one dict per token.
    prompt_logprobs: Optional[List[Optional[PositionLogprobs]]] = None
    #: Prompt tokens whose KV came from the prefix cache.
    num_cached_tokens: int = 0
    metrics: RequestMetrics = field(default_factory=RequestMetrics)

    @classmethod
    def _from_json(cls, raw: str) -> RequestOutput:
        d = json.loads(raw)
        return cls(
            request_id=d["request_id"],
            prompt=d["prompt"],
            prompt_token_ids=d["prompt_token_ids"],
            outputs=[_completion(c) for c in d["outputs"]],
            finished=d["finished"],
            prompt_logprobs=_positions(d["prompt_logprobs"]),
            num_cached_tokens=d["num_cached_tokens"],
            metrics=RequestMetrics(**d["metrics"]),
        )


@dataclass
class EmbeddingOutput:
    #: The pooled (and, unless ``normalize=False``, L2-normalised) vector.
    embedding: List[float]


@dataclass
class EmbeddingRequestOutput:
    """One prompt's embedding, as vLLM's ``LLM.embed`` returns it."""

    request_id: str
    prompt_token_ids: List[int]
    outputs: EmbeddingOutput
    finished: bool = True


def _position(entries: List[List[Any]]) -> PositionLogprobs:
    return {token: Logprob(logprob, rank, text) for token, logprob, rank, text in entries}


def _positions(raw: Optional[List[Any]]) -> Optional[List[Optional[PositionLogprobs]]]:
    if raw is None:
        return None
    return [None if p is None else _position(p) for p in raw]


def _completion(c: Dict[str, Any]) -> CompletionOutput:
    return CompletionOutput(
        index=c["index"],
        text=c["text"],
        token_ids=c["token_ids"],
        cumulative_logprob=c["cumulative_logprob"],
        logprobs=None if c["logprobs"] is None else [_position(p) for p in c["logprobs"]],
        finish_reason=c["finish_reason"],
        stop_reason=c["stop_reason"],
    )
