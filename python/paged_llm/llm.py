"""``LLM``: offline batches, as vLLM's ``LLM`` runs them. Every prompt of a call is submitted at
once (they share the engine's batches) and the call returns when all have finished, the GIL
released meanwhile; Ctrl-C aborts the batch.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Union

from ._client import (
    PromptType,
    _Client,
    _conversation_json,
    _flat_metrics,
    _params_json,
    _prompt_json,
)
from .lora import LoRAArg, _lora_list
from .outputs import EmbeddingOutput, EmbeddingRequestOutput, RequestOutput
from .pooling import PoolingParams
from .sampling import SamplingParams

ParamsArg = Union[SamplingParams, Sequence[SamplingParams], None]


class LLM(_Client):
    """A model loaded for offline inference: ``LLM("smollm2", max_num_seqs=64)``.

    One engine per object (a Ray actor holds one per process); ``shutdown()`` or leaving a
    ``with`` block stops it.
    """

    def generate(
        self,
        prompts: Union[PromptType, Sequence[PromptType]],
        sampling_params: ParamsArg = None,
        lora_request: LoRAArg = None,
    ) -> List[RequestOutput]:
        """One finished ``RequestOutput`` per prompt, in order. ``sampling_params``: one for
        every prompt, or one per prompt; ``None`` takes the model's defaults. ``lora_request``:
        the ``LoRARequest`` every prompt runs under, or one (or ``None``: the base model) per
        prompt; prompts of different adapters share the engine's batches."""
        prompts = _prompt_list(prompts)
        return self._run([_prompt_json(p) for p in prompts], sampling_params, lora_request)

    def chat(
        self,
        messages: Union[Sequence[Dict[str, Any]], Sequence[Sequence[Dict[str, Any]]]],
        sampling_params: ParamsArg = None,
        *,
        tools: Optional[List[Dict[str, Any]]] = None,
        documents: Optional[List[Dict[str, Any]]] = None,
        chat_template_kwargs: Optional[Dict[str, Any]] = None,
    ) -> List[RequestOutput]:
        """Generates replies to one conversation (a list of ``{"role", "content"}`` messages) or
        to a list of them, each rendered with the model's chat template."""
        batch = len(messages) > 0 and not isinstance(messages[0], dict)
        conversations = list(messages) if batch else [messages]
        prompts = [_conversation_json(c, tools, documents, chat_template_kwargs) for c in conversations]
        return self._run(prompts, sampling_params)

    def embed(
        self,
        prompts: Union[PromptType, Sequence[PromptType]],
        pooling_params: Optional[PoolingParams] = None,
    ) -> List[EmbeddingRequestOutput]:
        """One embedding per prompt, in order: the prompt's final hidden states pooled (the last
        token's by default, or their mean), cut to ``dimensions`` and normalised as
        ``pooling_params`` says. Batched through the same scheduler as ``generate`` (prefill
        only; the prompt's KV blocks are freed when it is done)."""
        prompts = [_prompt_json(p) for p in _prompt_list(prompts)]
        pooling = (pooling_params or PoolingParams())._json()
        vectors = self._engine.embed(prompts, pooling)
        token_ids = [self._engine.tokenize(p) for p in prompts]
        return [
            EmbeddingRequestOutput(request_id=str(i), prompt_token_ids=ids, outputs=EmbeddingOutput(v))
            for i, (ids, v) in enumerate(zip(token_ids, vectors))
        ]

    def metrics(self) -> Dict[str, Any]:
        """The engine's metrics between two steps: ``num_running``, ``num_waiting``,
        ``kv_usage``, ``prefix_hits`` / ``prefix_queries``, token counts, latencies."""
        return _flat_metrics(self._engine.metrics())

    def _run(self, prompts: List[str], sampling_params: ParamsArg, lora_request: LoRAArg = None) -> List[RequestOutput]:
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [_params_json(sampling_params)] * len(prompts)
        elif isinstance(sampling_params, (list, tuple)):
            params = [_params_json(p) for p in sampling_params]
            if len(params) != len(prompts):
                raise ValueError(f"{len(params)} sampling params for {len(prompts)} prompts")
        else:
            kind = type(sampling_params).__name__
            raise TypeError(f"sampling_params must be a SamplingParams or a list of them, not {kind}")
        loras = _lora_list(lora_request, len(prompts))
        raw = self._engine.generate(list(zip(prompts, params, loras)))
        return [RequestOutput._from_json(r) for r in raw]


def _prompt_list(prompts: Union[PromptType, Sequence[PromptType]]) -> List[PromptType]:
    """One prompt as a list of one; a list of ints is one prompt of token ids."""
    if isinstance(prompts, (str, dict)):
        return [prompts]
    prompts = list(prompts)
    if prompts and all(isinstance(t, int) for t in prompts):
        return [prompts]
    return prompts
