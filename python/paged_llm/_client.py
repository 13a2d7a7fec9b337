"""What ``LLM`` and ``AsyncLLM`` share: loading the model into a ``_core.Engine``, turning
prompts and sampling parameters into what the engine reads, tokenization, metrics, shutdown.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import _core
from .models import resolve_model
from .sampling import RequestOutputKind, SamplingParams

#: A prompt: text, token ids, or vLLM's ``{"prompt": ...}`` / ``{"prompt_token_ids": [...]}``.
PromptType = Union[str, Sequence[int], Dict[str, Any]]


class _Client:
    def __init__(self, model: Union[str, os.PathLike], **engine_args: Any) -> None:
        """Loads ``model`` (a Hugging Face folder, a GGUF file, or ``"smollm2"``) and starts the
        engine. ``engine_args`` are the engine's flags by their Python names (``max_num_seqs``,
        ``max_model_len``, ``num_kv_blocks``, ``kv_cache_gib``, ``enable_prefix_caching``,
        ``seed``, ``block_size``, ``max_num_batched_tokens``, ``device``, ``kv_cache_dtype``,
        ``quantization``, …); an unknown one raises ``TypeError``.
        """
        path = resolve_model(model)
        self._engine = _core.Engine(path, json.dumps(engine_args, default=os.fspath))

    @property
    def model_name(self) -> str:
        return self._engine.model_name

    @property
    def max_model_len(self) -> int:
        return self._engine.max_model_len

    def get_default_sampling_params(self) -> SamplingParams:
        """What a request without sampling parameters gets: vLLM's defaults with the model's
        generation config on top."""
        return SamplingParams(**json.loads(self._engine.default_sampling_params()))

    def tokenize(self, prompt: PromptType) -> List[int]:
        """The prompt's token ids, exactly as a request would see them."""
        return self._engine.tokenize(_prompt_json(prompt))

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._engine.decode(list(token_ids), skip_special_tokens)

    def kv_is_idle(self) -> bool:
        """Whether the engine holds no KV block: nothing running, nothing leaked."""
        return self._engine.kv_is_idle()

    def kv_events_endpoints(self) -> Optional[Tuple[str, Optional[str]]]:
        """The KV events publisher's PUB and replay addresses as bound (``kv_events_config``,
        vLLM's dict; a port of 0 is resolved here), or ``None`` when events are off."""
        return self._engine.kv_events_endpoints()

    def cached_block_hashes(self, medium: str = "GPU") -> List[int]:
        """Every block hash the KV cache holds, as KV events publish them: the prefix cache's
        (``"GPU"``, whatever the device) or, with events on, the registered blocks the host swap
        space holds (``"CPU"``): the set a subscriber that applied every batch so far holds."""
        if medium not in ("GPU", "CPU"):
            raise ValueError(f"medium must be 'GPU' or 'CPU', not {medium!r}")
        device, host = self._engine.cached_block_hashes()
        return device if medium == "GPU" else host

    def shutdown(self, drain: bool = False) -> None:
        """Stops the engine thread; unfinished requests are aborted (finished first with
        ``drain``). Later calls raise ``EngineStoppedError``."""
        self._engine.shutdown(drain)

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


def _flat_metrics(raw: str) -> Dict[str, Any]:
    """The engine's metrics snapshot with its gauges (``num_running``, ``num_waiting``,
    ``kv_usage``, ``prefix_hits``, ``prefix_queries``, …) at the top level."""
    metrics = json.loads(raw)
    metrics.update(metrics.pop("gauges"))
    return metrics


def _prompt_json(prompt: PromptType) -> str:
    if isinstance(prompt, str):
        return json.dumps({"text": prompt})
    if isinstance(prompt, dict):
        if "prompt_token_ids" in prompt:
            return json.dumps({"token_ids": list(prompt["prompt_token_ids"])})
        if "prompt" in prompt:
            return json.dumps({"text": prompt["prompt"]})
        raise TypeError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
    if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
        return json.dumps({"token_ids": list(prompt)})
    raise TypeError(f"a prompt is a str, a list of token ids or a dict, not {type(prompt).__name__}")


def _conversation_json(
    messages: Sequence[Dict[str, Any]],
    tools: Optional[List[Dict[str, Any]]],
    documents: Optional[List[Dict[str, Any]]],
    chat_template_kwargs: Optional[Dict[str, Any]],
) -> str:
    conversation = {
        "messages": list(messages),
        "tools": tools,
        "documents": documents,
        "kwargs": chat_template_kwargs or {},
    }
    return json.dumps({"conversation": conversation})


def _params_json(params: Optional[SamplingParams]) -> Optional[str]:
    if params is None:
        return None
    if not isinstance(params, SamplingParams):
        raise TypeError(f"sampling_params must be a SamplingParams, not {type(params).__name__}")
    return params._engine_json()


def _output_kind(params: Optional[SamplingParams]) -> str:
    kind = RequestOutputKind.CUMULATIVE if params is None else params.output_kind
    return kind.wire_name
