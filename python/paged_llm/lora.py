"""``LoRARequest``: the LoRA adapter a request runs under, as vLLM names it."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Optional, Sequence, Union


@dataclass(frozen=True)
class LoRARequest:
    """A PEFT adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``), or a
    llama.cpp LoRA GGUF file, under a name: ``LoRARequest("sql", 1, "/adapters/sql")``. The engine reads it on first use (off its
    step loop) and keeps it by name; ``lora_int_id`` is vLLM's and is not needed here (the name
    identifies the adapter). Needs the ``enable_lora=True`` engine argument."""

    lora_name: str
    lora_int_id: int
    lora_path: Union[str, "os.PathLike[str]"]

    def _fields(self) -> dict:
        return {"name": self.lora_name, "path": os.fspath(self.lora_path)}

    def _json(self) -> str:
        return json.dumps(self._fields())


LoRAArg = Union[LoRARequest, Sequence[Optional[LoRARequest]], None]


def _lora_list(lora_request: LoRAArg, n: int) -> list:
    """One adapter (JSON or None) per prompt: one for all, or one per prompt."""
    if lora_request is None or isinstance(lora_request, LoRARequest):
        return [lora_request._json() if lora_request else None] * n
    loras = list(lora_request)
    if len(loras) != n:
        raise ValueError(f"{len(loras)} LoRA requests for {n} prompts")
    return [r._json() if r else None for r in loras]
