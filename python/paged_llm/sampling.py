"""``SamplingParams``: how one request picks its tokens, with vLLM's names and defaults.

The fields and their defaults are the engine's own (``engine::SamplingParams``, read once from
``paged_llm._core``); a ``SamplingParams`` keeps only the fields it was given and is checked when
made or changed, so a value out of range raises ``InvalidRequestError`` at once and an unknown
field ``TypeError``. ``output_kind`` is the one field of the Python side: what ``AsyncLLM``
streams.
"""

from __future__ import annotations

import copy
import enum
import json
from typing import Any

from . import _core


class RequestOutputKind(enum.IntEnum):
    """What each output of a stream carries (vLLM's enum)."""

    #: Everything generated so far (vLLM's default).
    CUMULATIVE = 0
    #: Only what is new since the previous output.
    DELTA = 1
    #: Nothing until the request finishes, then everything.
    FINAL_ONLY = 2

    @property
    def wire_name(self) -> str:
        return self.name.lower()


_DEFAULTS: dict[str, Any] = json.loads(_core.sampling_defaults())
_PYTHON_ONLY: dict[str, Any] = {"output_kind": RequestOutputKind.CUMULATIVE}


def _normalized(name: str, value: Any) -> Any:
    if name == "stop" and isinstance(value, str):
        return [value]
    if name == "output_kind" and value is not None:
        return RequestOutputKind(value)
    return value


class SamplingParams:
    """Sampling parameters of one request: ``SamplingParams(temperature=0.0, max_tokens=32)``.

    The fields are vLLM's: ``n``, ``temperature``, ``top_p``, ``top_k``, ``min_p``,
    ``presence_penalty``, ``frequency_penalty``, ``repetition_penalty``, ``seed``, ``stop``
    (a string or a list), ``stop_token_ids``, ``include_stop_str_in_output``, ``ignore_eos``,
    ``max_tokens`` (``None``: up to the model's length), ``min_tokens``, ``logprobs``,
    ``prompt_logprobs``, ``skip_special_tokens``, ``logit_bias``, and ``output_kind``.
    """

    def __init__(self, **fields: Any) -> None:
        for name in fields:
            if name not in _DEFAULTS and name not in _PYTHON_ONLY:
                raise TypeError(f"SamplingParams() got an unexpected keyword argument {name!r}")
        given = {name: _normalized(name, value) for name, value in fields.items()}
        _check(given)
        object.__setattr__(self, "_fields", given)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names that are no attribute: the fields (and, while unpickling, the
        # private names that must stay missing).
        if name.startswith("_"):
            raise AttributeError(name)
        fields = self.__dict__.get("_fields", {})
        if name in fields:
            return fields[name]
        if name in _PYTHON_ONLY:
            return _PYTHON_ONLY[name]
        if name in _DEFAULTS:
            return copy.deepcopy(_DEFAULTS[name])
        raise AttributeError(f"'SamplingParams' object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in _DEFAULTS and name not in _PYTHON_ONLY:
            raise AttributeError(f"SamplingParams has no field {name!r}")
        given = {**self._fields, name: _normalized(name, value)}
        _check(given)
        object.__setattr__(self, "_fields", given)

    def clone(self) -> SamplingParams:
        return SamplingParams(**copy.deepcopy(self._fields))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SamplingParams):
            return NotImplemented
        return self._engine_json() == other._engine_json() and self.output_kind == other.output_kind

    def __repr__(self) -> str:
        given = ", ".join(f"{name}={value!r}" for name, value in self._fields.items())
        return f"SamplingParams({given})"

    def _engine_json(self) -> str:
        """The fields the engine reads, as JSON laid over its defaults."""
        return _engine_json(self._fields)


def _engine_json(fields: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in fields.items() if k not in _PYTHON_ONLY}, sort_keys=True)


def _check(fields: dict[str, Any]) -> None:
    _core.check_sampling_params(_engine_json(fields))
