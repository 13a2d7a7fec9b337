"""Fixtures of the package's tests: the real SmolLM2 GGUF (``PAGED_LLM_TEST_MODEL``), the Rust
engine's greedy outputs for ``greedy_prompts.json`` (``PAGED_LLM_EXPECTED``; ``cargo xtask
pytest`` sets both), one ``LLM`` and one ``AsyncLLM`` shared by a test module, the goldens
of the model crate (an f32 llama.cpp reference), and a local two-node Ray cluster on loopback
shared by the Ray tests."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

import paged_llm

REPO = Path(__file__).resolve().parents[2]
#: The engine arguments of the shared engines: those the Rust engine's outputs were made with
#: (`greedy_prompts.json`): prefix caching off, so that a prompt seen before is computed again
#: exactly as the first time, and a short max_model_len, so that a too-long prompt is quick.
ENGINE_ARGS = json.loads((Path(__file__).parent / "greedy_prompts.json").read_text())["engine"]
MAX_MODEL_LEN = ENGINE_ARGS["max_model_len"]
# The Ray tests run the examples themselves.
sys.path.insert(0, str(REPO / "python/examples"))
# Ray clusters of the tests stay on loopback (see the Ray Data example): set before Ray loads.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# No usage reports: nothing here reaches past the machine.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


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


@pytest.fixture(scope="session")
def ray_cluster():
    """A local two-node Ray cluster (the Ray Data example's: one CPU, one engine slot and a
    100 MB object store per node, no dashboard), connected, for the whole session: starting
    one costs more than its tests."""
    import ray

    import ray_data_batch
    from ray import cloudpickle

    # The examples folder is on this process's path only: its classes travel to the workers
    # by value.
    cloudpickle.register_pickle_by_value(ray_data_batch)
    cluster = ray_data_batch.start_local_cluster()
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
