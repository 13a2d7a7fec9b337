"""``LLM``: offline greedy generation reproduces the Rust engine's outputs (text, token ids,
finish reason) and, batched, the f32 goldens; batched prompts keep their order, chat goes
through the template, and the vLLM-shaped fields (logprobs, stop reasons, n samples, cached
tokens, metrics) are filled; the GIL is free while a batch runs (another thread can shut the
engine down under it); `kv_cache_dtype="int8"` serves."""

from __future__ import annotations

import pickle
import threading
import time

import pytest
from conftest import ENGINE_ARGS, greedy

import paged_llm


def _case_prompt(case: dict):
    return case["prompt"] if "prompt" in case else case["messages"]


def test_greedy_text_equals_the_rust_engine(llm, expected):
    # Each prompt alone, as the Rust engine ran it: a greedy token can depend on what shares
    # its batch (the quantized matmuls round by batch shape).
    params = greedy(expected["max_tokens"])
    kinds = {("prompt" in c, c["finish_reason"]) for c in expected["cases"]}
    assert {(True, "length"), (False, "length"), (False, "stop")} <= kinds, "plain and chat, cut and ended"
    for case in expected["cases"]:
        if "prompt" in case:
            [out] = llm.generate(case["prompt"], params)
        else:
            [out] = llm.chat(case["messages"], params)
        got = out.outputs[0]
        assert got.text == case["text"], _case_prompt(case)
        assert got.token_ids == case["token_ids"]
        assert got.finish_reason == case["finish_reason"]
        assert out.finished


def test_token_prompts_reproduce_the_f32_goldens(llm, goldens):
    n = len(goldens[0]["output_ids"])
    prompts = [{"prompt_token_ids": g["prompt_ids"]} for g in goldens]
    outs = llm.generate(prompts, greedy(n, ignore_eos=True))
    for g, out in zip(goldens, outs):
        assert out.prompt_token_ids == g["prompt_ids"]
        assert out.prompt is None
        assert out.outputs[0].token_ids == g["output_ids"], g["name"]


def test_batch_order_per_prompt_params_and_prompt_fields(llm):
    prompts = ["One, two, three,", "The sky is", "def add(a, b):"]
    lengths = [3, 5, 7]
    outs = llm.generate(prompts, [greedy(n, ignore_eos=True) for n in lengths])
    assert [o.prompt for o in outs] == prompts
    assert [len(o.outputs[0].token_ids) for o in outs] == lengths
    assert all(o.outputs[0].finish_reason == "length" for o in outs)
    assert len({o.request_id for o in outs}) == 3
    for prompt, out in zip(prompts, outs):
        assert out.prompt_token_ids == llm.tokenize(prompt)
        assert llm.decode(out.outputs[0].token_ids) == out.outputs[0].text
    # A single prompt and a list of token ids are one request each.
    assert len(llm.generate("The sky is", greedy(2))) == 1
    assert len(llm.generate(llm.tokenize("The sky is"), greedy(2))) == 1
    with pytest.raises(ValueError, match="2 sampling params for 3 prompts"):
        llm.generate(prompts, [greedy(1), greedy(1)])


def test_a_batch_past_the_waiting_queue_waits_for_room(model_path):
    with paged_llm.LLM(model_path, max_num_seqs=1, max_waiting=2, num_kv_blocks=64) as llm:
        outs = llm.generate([f"Count to {i}:" for i in range(5)], greedy(3, ignore_eos=True))
        assert [len(o.outputs[0].token_ids) for o in outs] == [3] * 5
        assert [o.prompt for o in outs] == [f"Count to {i}:" for i in range(5)]


def test_chat_reports_the_rendered_prompt(llm):
    out = llm.chat([{"role": "user", "content": "Hello!"}], greedy(4))[0]
    assert out.prompt.endswith("<|im_start|>assistant\n")
    assert "Hello!" in out.prompt
    assert out.prompt_token_ids == llm.tokenize(out.prompt)


def test_logprobs_stop_reasons_and_samples(llm):
    out = llm.generate("The capital of France is", greedy(6, logprobs=3, prompt_logprobs=1))[0]
    c = out.outputs[0]
    assert len(c.logprobs) == len(c.token_ids) == 6
    for token, position in zip(c.token_ids, c.logprobs):
        # Greedy: the chosen token is the most likely, listed with the other top ones.
        assert position[token].rank == 1
        assert 3 <= len(position) <= 4
        assert llm.decode([token], skip_special_tokens=False) == position[token].decoded_token
    assert c.cumulative_logprob == pytest.approx(sum(p[t].logprob for t, p in zip(c.token_ids, c.logprobs)), abs=1e-3)
    assert out.prompt_logprobs[0] is None
    assert len(out.prompt_logprobs) == len(out.prompt_token_ids)

    stop = c.text[2:5]
    stopped = llm.generate("The capital of France is", greedy(6, stop=stop))[0].outputs[0]
    assert (stopped.finish_reason, stopped.stop_reason) == ("stop", stop)
    assert stopped.text == c.text[: c.text.index(stop)]

    sampled = llm.generate("Once upon a time", paged_llm.SamplingParams(n=2, temperature=1.0, seed=7, max_tokens=8))
    assert [s.index for s in sampled[0].outputs] == [0, 1]
    again = llm.generate("Once upon a time", paged_llm.SamplingParams(n=2, temperature=1.0, seed=7, max_tokens=8))
    assert [s.token_ids for s in again[0].outputs] == [s.token_ids for s in sampled[0].outputs]


def test_metrics_and_the_prefix_cache(model_path):
    with paged_llm.LLM(model_path, num_kv_blocks=64, enable_prefix_caching=True) as llm:
        prompt = "A long shared prefix for the prefix cache to find again. " * 4
        llm.generate(prompt, greedy(2))
        before = llm.metrics()
        out = llm.generate(prompt, greedy(2))[0]
        after = llm.metrics()
        assert out.num_cached_tokens > 0
        assert after["prefix_hits"] > before["prefix_hits"]
        assert after["prefix_queries"] > before["prefix_queries"]
        for key in ("num_running", "num_waiting", "kv_usage", "requests_finished", "prefix_cache_hit_rate"):
            assert key in after
        assert after["num_running"] == after["num_waiting"] == 0
        assert llm.kv_is_idle()


def test_outputs_pickle(llm):
    out = llm.generate("The sky is", greedy(3, logprobs=1))[0]
    assert pickle.loads(pickle.dumps(out)) == out
    params = greedy(3, stop=["\n"])
    assert pickle.loads(pickle.dumps(params)) == params


def test_the_gil_is_released_while_a_batch_runs(model_path):
    llm = paged_llm.LLM(model_path, **ENGINE_ARGS)
    result = []
    worker = threading.Thread(target=lambda: result.extend(llm.generate(["Once upon a time"] * 2, greedy(400, ignore_eos=True))))
    worker.start()
    # Were the GIL held while the batch runs, this thread could not run the shutdown before the
    # batch had generated all its tokens.
    time.sleep(0.5)
    llm.shutdown()
    worker.join()
    assert [o.outputs[0].finish_reason for o in result] == ["abort", "abort"]
    assert all(len(o.outputs[0].token_ids) < 400 for o in result)


def test_speculative_config_keeps_every_greedy_token(model_path, llm):
    # vLLM's dict; drafts from the prompt never change a greedy token.
    prompt = "Repeat exactly: one two three four five six. one two three four"
    want = llm.generate(prompt, greedy(16, ignore_eos=True))[0].outputs[0].token_ids
    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}
    with paged_llm.LLM(model_path, num_kv_blocks=64, speculative_config=spec) as fast:
        assert fast.generate(prompt, greedy(16, ignore_eos=True))[0].outputs[0].token_ids == want
    # A draft model: here the model itself, which drafts exactly the greedy tokens.
    spec = {"method": "draft_model", "model": str(model_path), "num_speculative_tokens": 3}
    with paged_llm.LLM(model_path, num_kv_blocks=64, speculative_config=spec) as drafted:
        assert drafted.generate(prompt, greedy(16, ignore_eos=True))[0].outputs[0].token_ids == want
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        paged_llm.LLM(model_path, speculative_config={"method": "ngram", "num_speculative_tokens": 0})
    with pytest.raises(paged_llm.EngineError, match="draft model"):
        paged_llm.LLM(model_path, speculative_config={"method": "draft_model", "model": "/nonexistent", "num_speculative_tokens": 2})


def test_an_int8_kv_cache_generates(model_path):
    # vLLM's keyword; the int8 cache rounds keys and values, so only its shape is checked here
    # (its faithfulness is the Rust tests' and the quality bench's).
    with paged_llm.LLM(model_path, num_kv_blocks=64, kv_cache_dtype="int8") as llm:
        out = llm.generate("The capital of France is", greedy(8, ignore_eos=True))[0].outputs[0]
        assert len(out.token_ids) == 8 and out.text
