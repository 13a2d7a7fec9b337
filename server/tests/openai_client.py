"""The server as the official `openai` package sees it, plus a bounded load test.

Run by `server/tests/it/real_client.rs` against a server on 127.0.0.1 serving the real
SmolLM2 model: `python openai_client.py BASE_URL EXPECTED_GREEDY_JSON`. Prints one line per
check and exits non-zero on the first failure.
"""

import asyncio
import json
import sys

import httpx
import openai

BASE, EXPECTED = sys.argv[1], json.loads(sys.argv[2])
client = openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=120)
MODEL = client.models.list().data[0].id
HELLO = [{"role": "user", "content": EXPECTED["chat_prompt"]}]


def check(name, ok, detail=""):
    if not ok:
        print(f"FAIL {name}: {detail}", flush=True)
        sys.exit(1)
    print(f"ok {name}", flush=True)


# Chat, non-streaming and greedy: the engine's in-process text.
r = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=24, temperature=0)
check("chat greedy = in-process engine", r.choices[0].message.content == EXPECTED["chat_greedy"],
      f"{r.choices[0].message.content!r} vs {EXPECTED['chat_greedy']!r}")
check("chat usage", r.usage.completion_tokens > 0 and r.usage.total_tokens
      == r.usage.prompt_tokens + r.usage.completion_tokens, r.usage)

# Chat, streaming, with usage: the deltas concatenate to the same text.
chunks = list(client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=24, temperature=0,
                                             stream=True, stream_options={"include_usage": True}))
text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
check("chat stream = non-stream", text == EXPECTED["chat_greedy"], f"{text!r}")
check("chat stream usage chunk", chunks[-1].usage is not None and chunks[-1].usage.completion_tokens
      == r.usage.completion_tokens, chunks[-1])

# Completions, both ways; n=2 with logprobs; a stop string; a seed twice.
c = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=12, temperature=0)
check("completion", c.choices[0].text == EXPECTED["completion_greedy"], f"{c.choices[0].text!r}")
s = "".join(x.choices[0].text for x in client.completions.create(
    model=MODEL, prompt="The capital of France is", max_tokens=12, temperature=0, stream=True) if x.choices)
check("completion stream", s == c.choices[0].text, f"{s!r}")
n2 = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, n=2, temperature=0.9,
                               seed=11, logprobs=2)
check("n=2", len(n2.choices) == 2 and {x.index for x in n2.choices} == {0, 1}, n2.choices)
check("logprobs", all(len(x.logprobs.tokens) == len(x.logprobs.token_logprobs) > 0
                      and len(x.logprobs.top_logprobs[0]) >= 1 for x in n2.choices), n2.choices[0].logprobs)
again = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, n=2, temperature=0.9,
                                  seed=11, logprobs=2)
check("seed gives identical text twice", [x.text for x in again.choices] == [x.text for x in n2.choices])
cl = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8, temperature=0, logprobs=True,
                                    top_logprobs=2)
check("chat logprobs", len(cl.choices[0].logprobs.content) > 0
      and len(cl.choices[0].logprobs.content[0].top_logprobs) == 2, cl.choices[0].logprobs)
full = EXPECTED["chat_greedy"]
stop = full[len(full) // 2:len(full) // 2 + 3]
st = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=24, temperature=0, stop=[stop])
check("stop string", st.choices[0].finish_reason == "stop" and st.choices[0].message.content
      == full[:full.index(stop)], f"{st.choices[0].message.content!r} stop {stop!r}")

# Errors in OpenAI's shape, as the client raises them.
try:
    client.completions.create(model=MODEL, prompt="x", max_tokens=-1)
    check("400 for max_tokens -1", False, "accepted")
except openai.BadRequestError as e:
    check("400 for max_tokens -1", e.status_code == 400 and "max_tokens" in str(e), e)
try:
    client.completions.create(model="no-such-model", prompt="x")
    check("404 for an unknown model", False, "accepted")
except openai.NotFoundError as e:
    check("404 for an unknown model", e.status_code == 404, e)


async def load_test():
    """64 concurrent streams (a quarter hang up after a few chunks; 429s are retried), then a
    burst past the waiting queue, which must give 429s, not a hang."""
    limits = httpx.Limits(max_connections=256)
    async with httpx.AsyncClient(base_url=BASE, timeout=300, limits=limits) as http:
        async def one(i):
            body = {"model": MODEL, "prompt": f"Story {i}:", "max_tokens": 48, "stream": True,
                    "temperature": 0.8, "seed": i}
            for _ in range(200):
                async with http.stream("POST", "/v1/completions", json=body) as resp:
                    if resp.status_code == 429:
                        await asyncio.sleep(0.05)
                        continue
                    assert resp.status_code == 200, resp.status_code
                    chunks, done = 0, False
                    async for line in resp.aiter_lines():
                        if not line.startswith("data: "):
                            continue
                        if line == "data: [DONE]":
                            done = True
                            break
                        json.loads(line[6:])  # well-formed
                        chunks += 1
                        if i % 4 == 0 and chunks == 3:
                            return "dropped"
                    assert done, f"request {i} ended without [DONE]"
                    return "completed"
            raise AssertionError(f"request {i}: still 429 after 200 tries")

        results = await asyncio.gather(*(one(i) for i in range(64)))
        check("64 streams: the kept ones complete", results.count("completed") == 48
              and results.count("dropped") == 16, results)
        for _ in range(400):
            m = (await http.get("/metrics")).text
            vals = {l.split("{")[0]: float(l.rsplit(" ", 1)[1]) for l in m.splitlines()
                    if l.startswith("vllm:num_requests_") or l.startswith("vllm:kv_cache_usage_perc")}
            if vals and all(v == 0 for v in vals.values()):
                break
            await asyncio.sleep(0.05)
        check("after the load: 0 running, 0 waiting, KV usage 0", all(v == 0 for v in vals.values()), vals)

        async def burst(i):
            body = {"model": MODEL, "prompt": f"Burst {i}", "max_tokens": 4}
            return (await http.post("/v1/completions", json=body)).status_code

        codes = await asyncio.wait_for(asyncio.gather(*(burst(i) for i in range(EXPECTED["burst"]))), 300)
        check("a burst past max_waiting gets 429s", codes.count(429) > 0 and set(codes) <= {200, 429},
              sorted(set(codes)))


asyncio.run(load_test())
print("all ok")
