"""Fixtures of the package's tests: the real SmolLM2 GGUF (``PAGED_LLM_TEST_MODEL``), the Rust
engine's greedy outputs for ``greedy_prompts.json`` (``PAGED_LLM_EXPECTED``; ``cargo xtask
pytest`` sets both), one ``LLM`` and one ``AsyncLLM`` shared by a test module, and the goldens
of the model crate (an f32 llama.cpp reference)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import paged_llm

REPO = Path(__file__).resolve().parents[2]
#: The engine arguments of the shared engines: those the Rust engine's outputs were made with
#: (`greedy_prompts.json`): prefix caching off, so that a prompt seen before is computed again
#: exactly as the first time, and a short max_model_len, so that a too-long prompt is quick.
ENGINE_ARGS = json.loads((Path(__file__).parent / "greedy_prompts.json").read_text())["engine"]
MAX_MODEL_LEN = ENGINE_ARGS["max_model_len"]


def _env_path(name: str) -> Path:
    value = os.environ.get(name)
    if not value or not Path(value).exists():
        pytest.fail(f"{name} is unset or missing: run the suite with `cargo xtask pytest`", pytrace=False)
    return Path(value)


@pytest.fixture(scope="session")
def model_path() -> str:
    return str(_env_path("PAGED_LLM_TEST_MODEL"))


@pytest.fixture(scope="session")
def expected() -> dict:
    return json.loads(_env_path("PAGED_LLM_EXPECTED").read_text())


@pytest.fixture(scope="session")
def goldens() -> list:
    data = json.loads((REPO / "model/tests/data/smollm2-135m-instruct.json").read_text())
    return data["generations"]


@pytest.fixture(scope="module")
def llm(model_path: str):
    with paged_llm.LLM(model_path, **ENGINE_ARGS) as llm:
        yield llm


@pytest.fixture(scope="module")
def async_llm(model_path: str):
    with paged_llm.AsyncLLM(model_path, **ENGINE_ARGS) as llm:
        yield llm


def greedy(max_tokens: int, **fields) -> paged_llm.SamplingParams:
    return paged_llm.SamplingParams(temperature=0.0, max_tokens=max_tokens, **fields)
