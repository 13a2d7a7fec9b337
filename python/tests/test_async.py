"""``AsyncLLM``: streamed outputs (delta, cumulative, final only) add up to what the Rust
engine returns, concurrent streams run side by side, and a stream left early (``aclose``, a
cancelled task, ``abort``) aborts its request and frees its KV blocks."""

from __future__ import annotations

import asyncio

import pytest
from conftest import greedy

import paged_llm

DELTA = paged_llm.RequestOutputKind.DELTA
FINAL_ONLY = paged_llm.RequestOutputKind.FINAL_ONLY


async def _collect(stream):
    return [out async for out in stream]


async def _wait_idle(llm, at_least_aborted: int) -> dict:
    """Polls the engine until nothing runs and no KV block is held (5 s at most)."""
    for _ in range(500):
        m = await llm.metrics()
        if m["num_running"] == m["num_waiting"] == 0 and m["kv_usage"] == 0.0:
            if m["requests_aborted"] >= at_least_aborted:
                return m
        await asyncio.sleep(0.01)
    pytest.fail(f"the engine did not free the request: {m}")


def test_delta_stream_adds_up_to_the_rust_engine(async_llm, expected):
    case = next(c for c in expected["cases"] if "prompt" in c)
    params = greedy(expected["max_tokens"], output_kind=DELTA)
    outs = asyncio.run(_collect(async_llm.generate(case["prompt"], params)))
    assert len(outs) >= 3, "a stream of several increments"
    assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
    assert "".join(c.text for o in outs for c in o.outputs) == case["text"]
    assert [t for o in outs for c in o.outputs for t in c.token_ids] == case["token_ids"]
    assert outs[-1].outputs[-1].finish_reason == case["finish_reason"]


def test_chat_stream_and_the_other_output_kinds(async_llm, expected):
    case = next(c for c in expected["cases"] if "messages" in c)
    n = expected["max_tokens"]
    cumulative = asyncio.run(_collect(async_llm.chat(case["messages"], greedy(n))))
    texts = [o.outputs[0].text for o in cumulative]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))
    assert texts[-1] == case["text"]
    assert cumulative[-1].outputs[0].token_ids == case["token_ids"]
    final = asyncio.run(_collect(async_llm.chat(case["messages"], greedy(n, output_kind=FINAL_ONLY))))
    assert len(final) == 1 and final[0].finished
    assert final[0].outputs[0].text == case["text"]


def test_concurrent_streams_interleave_and_add_up(async_llm):
    prompts = ["The sky is", "def add(a, b):", "One, two, three,", "Rivers flow"]
    arrivals = []

    async def consume(i: int, prompt: str):
        outs = []
        async for out in async_llm.generate(prompt, greedy(12, ignore_eos=True, output_kind=DELTA)):
            arrivals.append(i)
            outs.append(out)
        return outs

    async def main():
        return await asyncio.gather(*(consume(i, p) for i, p in enumerate(prompts)))

    streams = asyncio.run(main())
    # Every stream had its first output before any had its last: they ran side by side.
    last_first = max(arrivals.index(i) for i in range(len(prompts)))
    first_last = min(len(arrivals) - 1 - arrivals[::-1].index(i) for i in range(len(prompts)))
    assert last_first < first_last, arrivals
    for outs in streams:
        ids = [t for o in outs for c in o.outputs for t in c.token_ids]
        assert len(ids) == 12 and outs[-1].finished
        assert "".join(c.text for o in outs for c in o.outputs) == async_llm.decode(ids)


def test_aclose_aborts_and_frees_the_blocks(async_llm):
    async def main():
        before = (await async_llm.metrics())["requests_aborted"]
        stream = async_llm.generate("Once upon a time", greedy(400, ignore_eos=True))
        first = await stream.__anext__()
        assert not first.finished
        assert (await async_llm.metrics())["num_running"] == 1
        await stream.aclose()
        return await _wait_idle(async_llm, before + 1)

    asyncio.run(main())
    assert async_llm.kv_is_idle()


def test_cancelling_the_task_aborts_and_frees_the_blocks(async_llm):
    async def main():
        before = (await async_llm.metrics())["requests_aborted"]
        started = asyncio.Event()

        async def consume():
            async for _ in async_llm.generate("Once upon a time", greedy(400, ignore_eos=True)):
                started.set()

        task = asyncio.ensure_future(consume())
        await asyncio.wait_for(started.wait(), 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await _wait_idle(async_llm, before + 1)

    asyncio.run(main())
    assert async_llm.kv_is_idle()


def test_abort_by_request_id_ends_the_stream(async_llm):
    async def main():
        stream = async_llm.generate("Once upon a time", greedy(400, ignore_eos=True), request_id="to-abort")
        await stream.__anext__()
        assert await async_llm.abort("to-abort")
        rest = [out async for out in stream]
        assert rest[-1].finished and rest[-1].outputs[0].finish_reason == "abort"
        assert not await async_llm.abort("to-abort")
        await _wait_idle(async_llm, 1)

    asyncio.run(main())
