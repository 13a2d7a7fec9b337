"""LoRA from Python as vLLM's: ``LLM(..., enable_lora=True)`` and ``generate(...,
lora_request=LoRARequest(name, id, path))`` over the tiny Llama of the model crate's test data
and its PEFT adapters: each prompt gets PEFT's greedy tokens (``model/tests/data/lora/``), alone
or in one batch with the base model and the other adapter; ``AsyncLLM`` streams under an adapter;
a bad adapter is refused without stopping the engine."""

import asyncio
import json

import pytest

from paged_llm import LLM, AsyncLLM, InvalidRequestError, LoRARequest, RequestOutputKind, SamplingParams

from conftest import REPO

DATA = REPO / "model/tests/data"
BASE = DATA / "families/llama"
ARGS = dict(enable_lora=True, max_loras=2, max_lora_rank=16, kv_cache_dtype="f32", num_kv_blocks=64)


def expected(adapter):
    if adapter is None:
        gens = json.loads((BASE / "expected.json").read_text())["generations"]
    else:
        gens = json.loads((DATA / "lora/llama/expected.json").read_text())["adapters"][adapter]
    return [(g["prompt_ids"], g["greedy_ids"]) for g in gens[:2]]


def lora(name):
    return LoRARequest(name, {"sql": 1, "chat": 2}[name], DATA / "lora/llama" / name)


GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def test_generate_under_adapters_gives_pefts_tokens_alone_and_mixed():
    with LLM(str(BASE), **ARGS) as llm:
        cases = [(p, want, a) for a in (None, "sql", "chat") for p, want in expected(a)]
        for prompt, want, adapter in cases:
            out = llm.generate([prompt], GREEDY, lora_request=lora(adapter) if adapter else None)
            assert list(out[0].outputs[0].token_ids) == want, adapter
        mixed = llm.generate(
            [p for p, _, _ in cases], GREEDY, lora_request=[lora(a) if a else None for _, _, a in cases]
        )
        assert [list(o.outputs[0].token_ids) for o in mixed] == [w for _, w, _ in cases]
        with pytest.raises(InvalidRequestError, match="no LoRA adapter|adapter_config.json"):
            llm.generate([cases[0][0]], GREEDY, lora_request=LoRARequest("x", 9, DATA / "families/llama"))
        with pytest.raises(ValueError, match="2 LoRA requests for 1 prompts"):
            llm.generate([cases[0][0]], GREEDY, lora_request=[None, None])
        assert list(llm.generate([cases[0][0]], GREEDY)[0].outputs[0].token_ids) == cases[0][1]


def test_async_llm_streams_under_an_adapter():
    (prompt, want), _ = expected("chat")

    async def run():
        with AsyncLLM(str(BASE), **ARGS) as llm:
            tokens = []
            params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
            async for out in llm.generate(prompt, params, lora_request=lora("chat")):
                tokens.extend(out.outputs[0].token_ids)
            return tokens

    assert asyncio.run(run()) == want


def test_lora_needs_enable_lora():
    with LLM(str(BASE), kv_cache_dtype="f32", num_kv_blocks=32) as llm:
        (prompt, _), _ = expected(None)
        with pytest.raises(InvalidRequestError, match="enable-lora"):
            llm.generate([prompt], GREEDY, lora_request=lora("sql"))
