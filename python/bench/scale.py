"""The ``scale`` bench group (``cargo xtask bench --only scale``): the engine on Ray Serve
against itself in process, one replica against two, and prefix-aware routing against round
robin, on a local single-node Ray cluster; writes the figures as a flat JSON map (and a
markdown fragment) into ``$BENCH_FIGURES_DIR``.

- ``scale.serve_over_inprocess``: output tokens/s of one Serve replica (through the HTTP
  proxy, the ingress and the replica) over the same requests on an in-process ``AsyncLLM``.
- ``scale.serve_2rep_over_1rep``: output tokens/s of two replicas over one, on this machine
  (with few cores it measures the overhead of a second engine, not scaling).
- ``scale.prefix_routing_hit_over_rr``: the prefix cache's hit rate summed over two replicas
  (their ``vllm:prefix_cache_hits_total`` / ``queries_total``) with prefix-aware routing
  over round robin, on 8 users each sending 6 turns behind a long system prompt of their own.

Throughput requests are not streamed: a stream's events cross three Python processes each,
which is the proxy's cost per token, not the deployment's. Ray's workers run at the driver's
priority here (``RAY_worker_niceness=0``). Medians of an odd number of rounds.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

# The cluster stays on loopback (see python/examples/ray_data_batch.py): set before Ray loads.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# No usage reports: nothing here reaches past the machine.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Ray runs its workers (the replicas, the proxy) at niceness 15 by default: on a machine with
# other work that measures their priority, not the deployment. Same priority as in process.
os.environ.setdefault("RAY_worker_niceness", "0")

import paged_llm  # noqa: E402
from paged_llm.serve import build_app  # noqa: E402

QUICK = os.environ.get("BENCH_QUICK") == "1"
ROUNDS = 1 if QUICK else 3
#: Throughput workload: this many concurrent requests of this many output tokens each.
TPUT_REQUESTS = 32
TPUT_TOKENS = 64
TPUT_ENGINE = {"max_num_seqs": 32, "num_kv_blocks": 512, "max_model_len": 1024}
#: Prefix workload: a per-replica KV cache that holds about half the users' conversations,
#: so that where a conversation goes decides whether its prefix is still cached.
USERS, TURNS, REPLY_TOKENS = 8, 6, 16
SYSTEM_WORDS = 660
PREFIX_ENGINE = {"max_num_seqs": 16, "num_kv_blocks": 256, "max_model_len": 2048, "enable_prefix_caching": True}

WORDS = (
    "river mountain garden window letter market winter silver engine paper forest morning "
    "station harbor bridge candle pocket ladder mirror orange planet thunder blanket castle "
    "violin meadow button dragon feather island lantern marble needle ocean pepper rabbit "
    "saddle tunnel velvet wagon yellow anchor basket cinnamon desert falcon glacier hammer"
).split()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tput_prompts() -> List[str]:
    return [f"Request {i}: tell a long story about the {WORDS[i % len(WORDS)]}." for i in range(TPUT_REQUESTS)]


async def _inprocess_round(llm: paged_llm.AsyncLLM) -> float:
    params = paged_llm.SamplingParams(
        temperature=0.0, max_tokens=TPUT_TOKENS, ignore_eos=True, output_kind=paged_llm.RequestOutputKind.FINAL_ONLY
    )

    async def one(prompt: str) -> int:
        last = None
        async for out in llm.generate(prompt, params):
            last = out
        return len(last.outputs[0].token_ids)

    start = time.monotonic()
    tokens = await asyncio.gather(*(one(p) for p in _tput_prompts()))
    return sum(tokens) / (time.monotonic() - start)


async def _serve_round(client: Any) -> float:
    async def one(prompt: str) -> int:
        out = await client.completions.create(
            model=client.served_model, prompt=prompt, max_tokens=TPUT_TOKENS, temperature=0.0, extra_body={"ignore_eos": True}
        )
        return out.usage.completion_tokens

    start = time.monotonic()
    tokens = await asyncio.gather(*(one(p) for p in _tput_prompts()))
    return sum(tokens) / (time.monotonic() - start)


def _system_prompt(user: int) -> str:
    rng = random.Random(user)
    words = " ".join(rng.choice(WORDS) for _ in range(SYSTEM_WORDS))
    return f"You are the assistant of user {user}. Remember these words in order: {words}."


async def _conversations(client: Any) -> int:
    """8 users at once, each sending its turns one after another; returns the first turn's
    prompt tokens (the system prompt's length, as the model counts it)."""
    first_prompt_tokens = []

    async def user(u: int) -> None:
        messages = [{"role": "system", "content": _system_prompt(u)}]
        for turn in range(TURNS):
            messages.append({"role": "user", "content": f"Turn {turn}: which word comes after number {turn}?"})
            out = await client.chat.completions.create(
                model=client.served_model, messages=messages, max_tokens=REPLY_TOKENS, temperature=0.0
            )
            if turn == 0:
                first_prompt_tokens.append(out.usage.prompt_tokens)
            messages.append({"role": "assistant", "content": out.choices[0].message.content or ""})

    async with client:
        await asyncio.gather(*(user(u) for u in range(USERS)))
    return int(statistics.median(first_prompt_tokens))


def _counter(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _prefix_hit_rate(base: str) -> Tuple[float, int]:
    import urllib.request

    with urllib.request.urlopen(f"{base}/replicas/metrics", timeout=60) as r:
        texts: Dict[str, str] = json.load(r)
    if len(texts) != 2:
        raise RuntimeError(f"expected the metrics of 2 replicas, got {list(texts)}")
    hits = sum(_counter(t, "vllm:prefix_cache_hits_total") for t in texts.values())
    queries = sum(_counter(t, "vllm:prefix_cache_queries_total") for t in texts.values())
    return hits / queries, int(queries)


def _client(base: str) -> Any:
    """An openai-python async client of the deployment, knowing the model it serves."""
    import urllib.request

    import openai

    with urllib.request.urlopen(f"{base}/v1/models", timeout=60) as r:
        served = json.load(r)["data"][0]["id"]
    client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=600)
    client.served_model = served
    return client


def _deploy(model: str, **kw: Any) -> None:
    from ray import serve

    serve.run(build_app(model, **kw), name="bench", route_prefix="/")


def _undeploy() -> None:
    from ray import serve

    serve.delete("bench")


def main() -> int:
    import ray
    from ray import serve

    model = os.environ["PAGED_LLM_TEST_MODEL"]
    out_dir = Path(os.environ.get("BENCH_FIGURES_DIR", "."))
    figures: Dict[str, float] = {}
    notes: List[str] = []

    ray.init(num_cpus=2, object_store_memory=100 * 1024 * 1024, include_dashboard=False, log_to_driver=False)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    # One loop for every client and stream of the run.
    loop = asyncio.new_event_loop()
    run = loop.run_until_complete
    try:
        # The in-process engine and the one replica take turns, round by round and in
        # alternating order, so that a change in the machine's load falls on both.
        local: List[float] = []
        one: List[float] = []
        _deploy(model, engine_args=TPUT_ENGINE, num_replicas=1, routing="round_robin")
        client = _client(base)
        with paged_llm.AsyncLLM(model, **TPUT_ENGINE) as llm:
            run(_inprocess_round(llm))  # warm-up
            run(_serve_round(client))
            for i in range(ROUNDS):
                if i % 2 == 0:
                    local.append(run(_inprocess_round(llm)))
                    one.append(run(_serve_round(client)))
                else:
                    one.append(run(_serve_round(client)))
                    local.append(run(_inprocess_round(llm)))
        # A second replica beside the first (Serve scales the application in place).
        _deploy(model, engine_args=TPUT_ENGINE, num_replicas=2, routing="round_robin")
        run(_serve_round(client))
        two = [run(_serve_round(client)) for _ in range(ROUNDS)]
        run(client.close())
        _undeploy()
        figures["scale.serve_over_inprocess"] = statistics.median(one) / statistics.median(local)
        figures["scale.serve_2rep_over_1rep"] = statistics.median(two) / statistics.median(one)
        notes.append(
            f"throughput, output tok/s (medians of {ROUNDS}): in process {statistics.median(local):.1f}, "
            f"Serve 1 replica {statistics.median(one):.1f}, 2 replicas {statistics.median(two):.1f}"
        )

        rates: Dict[str, List[float]] = {"prefix": [], "round_robin": []}
        system_tokens = 0
        for _ in range(ROUNDS):
            for routing in rates:
                _deploy(model, engine_args=PREFIX_ENGINE, num_replicas=2, routing=routing)
                try:
                    client = _client(base)
                    system_tokens = run(_conversations(client))
                    rate, queries = _prefix_hit_rate(base)
                    rates[routing].append(rate)
                finally:
                    _undeploy()
        prefix, rr = statistics.median(rates["prefix"]), statistics.median(rates["round_robin"])
        figures["scale.prefix_routing_hit_over_rr"] = prefix / rr if rr > 0 else float("inf")
        notes.append(
            f"prefix cache hit rate over 2 replicas ({USERS} users x {TURNS} turns, system prompts of "
            f"{system_tokens} prompt tokens at the first turn): prefix routing {prefix:.3f}, round robin {rr:.3f}"
        )
    finally:
        loop.close()
        serve.shutdown()
        ray.shutdown()

    (out_dir / "scale.json").write_text(json.dumps(figures, indent=2) + "\n")
    (out_dir / "scale.md").write_text("## Ray Serve (`scale`)\n\n" + "".join(f"- {n}\n" for n in notes))
    for name, value in figures.items():
        print(f"{name} = {value:.4f}")
    for note in notes:
        print(note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
