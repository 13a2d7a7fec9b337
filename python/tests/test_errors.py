"""Bad arguments raise typed exceptions: ``InvalidRequestError`` (a ``ValueError``) for what a
request asks, ``TypeError`` for an unknown name or a wrong type, ``FileNotFoundError`` for a
missing model, ``EngineStoppedError`` after shutdown; and a refused request leaves nothing
running."""

from __future__ import annotations

import asyncio

import pytest
from conftest import ENGINE_ARGS, MAX_MODEL_LEN, greedy

import paged_llm
from paged_llm import InvalidRequestError
from paged_llm.models import resolve_model


def test_sampling_params_out_of_range_raise_at_once():
    assert issubclass(InvalidRequestError, ValueError)
    for fields in ({"temperature": -0.5}, {"max_tokens": 0}, {"top_p": 0.0}, {"n": 0}, {"stop": [""]}):
        with pytest.raises(InvalidRequestError):
            paged_llm.SamplingParams(**fields)
    params = greedy(4)
    with pytest.raises(InvalidRequestError, match="temperature"):
        params.temperature = -1.0
    assert params.temperature == 0.0


def test_unknown_names_and_wrong_types_are_type_errors(model_path):
    with pytest.raises(TypeError, match="'best_of'"):
        paged_llm.SamplingParams(best_of=2)
    with pytest.raises(TypeError, match="temperature"):
        paged_llm.SamplingParams(temperature="hot")
    with pytest.raises(TypeError, match="not_an_engine_arg"):
        paged_llm.LLM(model_path, not_an_engine_arg=1)
    with pytest.raises(TypeError, match="max_num_seqs"):
        paged_llm.LLM(model_path, max_num_seqs="many")
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        paged_llm.LLM(model_path, kv_cache_dtype="f8")
    # fp8 is a KV cache of CUDA's: on the CPU, an engine error naming the combination.
    with pytest.raises(paged_llm.EngineError, match="fp8_e4m3 on cpu"):
        paged_llm.LLM(model_path, kv_cache_dtype="fp8")


def test_engine_failures_are_engine_errors(model_path):
    assert issubclass(paged_llm.EngineError, RuntimeError)
    with pytest.raises(paged_llm.EngineError, match="max_model_len"):
        paged_llm.LLM(model_path, max_model_len=10**9)


def test_missing_models_are_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="no model at"):
        paged_llm.LLM(str(tmp_path / "nowhere"))
    with pytest.raises(paged_llm.EngineError):
        paged_llm.LLM(str(tmp_path))  # a folder, but no model in it


def test_the_named_model_is_found_in_its_package(model_path):
    path = resolve_model("smollm2")
    assert path.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    with open(path, "rb") as named, open(model_path, "rb") as fetched:
        assert named.read(1 << 16) == fetched.read(1 << 16)


def test_refused_requests(llm):
    too_long = "word " * (MAX_MODEL_LEN + 10)
    with pytest.raises(InvalidRequestError, match="max_model_len"):
        llm.generate(too_long, greedy(4))
    with pytest.raises(InvalidRequestError, match="vocabulary"):
        llm.generate({"prompt_token_ids": [1, 10**7]}, greedy(4))
    with pytest.raises(InvalidRequestError, match="empty prompt"):
        llm.generate({"prompt_token_ids": []}, greedy(4))
    with pytest.raises(TypeError):
        llm.generate([1.5], greedy(4))
    with pytest.raises(TypeError):
        llm.generate("The sky is", {"temperature": 0})
    # One refusal in a batch refuses the batch, and nothing of it is left running.
    with pytest.raises(InvalidRequestError):
        llm.generate(["The sky is", too_long], greedy(4))
    m = llm.metrics()
    assert m["num_running"] == m["num_waiting"] == 0
    assert llm.kv_is_idle()


def test_async_refusal_raises_at_the_first_output(async_llm):
    async def main():
        with pytest.raises(InvalidRequestError, match="max_model_len"):
            async for _ in async_llm.generate("word " * (MAX_MODEL_LEN + 10), greedy(4)):
                pass

    asyncio.run(main())


def test_a_stopped_engine_refuses(model_path):
    llm = paged_llm.LLM(model_path, **ENGINE_ARGS)
    assert llm.generate("The sky is", greedy(2))[0].finished
    llm.shutdown()
    with pytest.raises(paged_llm.EngineStoppedError):
        llm.generate("The sky is", greedy(2))
