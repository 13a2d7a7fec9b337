"""Ray Serve: ``paged_llm.serve``'s deployment of two replicas behind its ingress, driven with
openai-python through Serve's HTTP proxy on loopback: chat and completions, streaming and not,
answered as the Rust engine answers; routing on the replicas' KV cache events (``routing="events"``,
the approximate prefix router's own choices are ``test_routing.py``'s) keeps a conversation on one
replica and spreads conversations; a replica killed mid-load loses no request, is replaced, and
its index is dropped from the router."""

from __future__ import annotations

import concurrent.futures
import json
import socket
import time
import urllib.request

import openai
import pytest
from conftest import ENGINE_ARGS

from paged_llm.serve import ATTEMPTS_HEADER, REPLICA_HEADER, build_app

APP = "llm"
#: The greedy oracle's engine with its prefix cache on: a prompt's first run computes it
#: exactly as with the cache off.
SERVE_ENGINE_ARGS = {**ENGINE_ARGS, "enable_prefix_caching": True}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def base_url(ray_cluster, model_path):
    from ray import serve

    port = _free_port()
    # One proxy: the two nodes share this host's loopback.
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
    app = build_app(model_path, engine_args=SERVE_ENGINE_ARGS, num_replicas=2, routing="events")
    serve.run(app, name=APP, route_prefix="/")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()


@pytest.fixture(scope="module")
def client(base_url):
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    models = client.models.list()
    assert len(models.data) == 1
    # Requests name the served model: a name the server does not serve is a 404.
    client.served_model = models.data[0].id
    return client


def _completion(client, prompt, max_tokens, **kw):
    raw = client.completions.with_raw_response.create(
        model=client.served_model, prompt=prompt, max_tokens=max_tokens, temperature=0.0, **kw
    )
    return raw.parse(), raw.headers


def test_two_replicas_answer_as_the_rust_engine(client, expected):
    model = client.served_model
    n = expected["max_tokens"]
    replicas = set()
    for case in expected["cases"]:
        if "prompt" in case:
            out, headers = _completion(client, case["prompt"], n)
            assert out.choices[0].text == case["text"]
        else:
            raw = client.chat.completions.with_raw_response.create(
                model=model, messages=case["messages"], max_tokens=n, temperature=0.0
            )
            out, headers = raw.parse(), raw.headers
            assert out.choices[0].message.content == case["text"]
        assert out.choices[0].finish_reason == case["finish_reason"]
        replicas.add(headers[REPLICA_HEADER])
    assert len(replicas) == 2, "new prompts spread over both replicas"


def test_streams_of_chat_and_completions(client):
    deltas = [
        c.choices[0].text
        for c in client.completions.create(model=client.served_model, prompt="Rivers flow", max_tokens=12, stream=True)
        if c.choices
    ]
    assert len(deltas) >= 2 and "".join(deltas)
    chunks = list(
        client.chat.completions.create(
            model=client.served_model, messages=[{"role": "user", "content": "Say hello."}], max_tokens=12, stream=True
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_prefix_routing_keeps_each_conversation_on_one_replica(client, base_url):
    by_user = {}
    for turn in range(3):
        for user in range(4):
            system = f"You are assistant number {user}. " + f"User {user} likes topic {user}. " * 12
            messages = [{"role": "system", "content": system}]
            messages += [{"role": "user", "content": f"Question {t}?"} for t in range(turn + 1)]
            raw = client.chat.completions.with_raw_response.create(
                model=client.served_model, messages=messages, max_tokens=2
            )
            by_user.setdefault(user, set()).add(raw.headers[REPLICA_HEADER])
    assert all(len(r) == 1 for r in by_user.values()), by_user
    assert len(set.union(*by_user.values())) == 2, "conversations spread over both replicas"
    # Each replica's own Prometheus text: later turns found their conversation's prefix.
    with urllib.request.urlopen(f"{base_url}/replicas/metrics", timeout=60) as r:
        texts = json.load(r)
    assert set(texts) == set.union(*by_user.values())
    hits = [line for t in texts.values() for line in t.splitlines() if line.startswith("vllm:prefix_cache_hits")]
    assert hits and all(float(line.rsplit(" ", 1)[1]) > 0 for line in hits), hits
    # The router followed both replicas' events: each one's index holds blocks.
    index = _kv_index(base_url)
    assert set(index) == set(texts) and all(n > 0 for n in index.values()), index


def _kv_index(base_url) -> dict:
    with urllib.request.urlopen(f"{base_url}/replicas/kv_index", timeout=60) as r:
        return json.load(r)


def _running(base_url) -> dict:
    """Requests running on each replica, from its own metrics."""
    with urllib.request.urlopen(f"{base_url}/replicas/metrics", timeout=60) as r:
        texts = json.load(r)
    running = {}
    for rid, text in texts.items():
        lines = [line for line in text.splitlines() if line.startswith("vllm:num_requests_running")]
        running[rid] = sum(float(line.rsplit(" ", 1)[1]) for line in lines)
    return running


def test_a_killed_replica_loses_no_request(client, base_url):
    import ray
    from ray import serve

    prompts = [f"Story {i}: once upon a time" for i in range(12)]
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        futures = [pool.submit(_completion, client, p, 48, extra_body={"ignore_eos": True}) for p in prompts]
        # The victim: a replica with requests running (read from its metrics), killed mid-load.
        deadline = time.monotonic() + 30
        victim = None
        while victim is None and time.monotonic() < deadline:
            busy = [rid for rid, n in _running(base_url).items() if n > 0]
            victim = busy[0] if busy else None
        assert victim is not None, "no replica was running requests"
        ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
        results = [f.result() for f in futures]
    ids = [out.id for out, _ in results]
    assert len(set(ids)) == len(prompts), "each request answered once"
    assert all(out.choices[0].text and out.usage.completion_tokens == 48 for out, _ in results)
    assert all(h[REPLICA_HEADER] != victim for _, h in results), "answered by a live replica"
    assert any(int(h[ATTEMPTS_HEADER]) > 1 for _, h in results), "some were retried"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        states = serve.status().applications[APP].deployments["LLMServer"].replica_states
        if states.get("RUNNING") == 2:
            break
        time.sleep(0.5)
    assert states.get("RUNNING") == 2, f"Serve replaced the replica: {states}"
    out, headers = _completion(client, "After the failover,", 4)
    assert out.choices[0].text and headers[REPLICA_HEADER] != victim
    assert victim not in _kv_index(base_url), "the dead replica's index was dropped"
