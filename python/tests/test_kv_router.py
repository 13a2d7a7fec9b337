"""The KV-events router's index and choices without a cluster: ``BlockIndex`` fed with
``KVEventBatch``es (as decoded from a replica's events), ``ReplicaSubscriber`` against a
stand-in publisher, prompts tokenized by
``PromptTokenizer`` as a replica admits them (checked against a real engine's tokenization),
and ``KvEventsRouter._rank`` over stand-in replicas whose queues, KV usage and indexes the
test sets."""

from __future__ import annotations

import json
import threading
import time
from typing import Dict, List, Optional, Set

import msgspec
import zmq

import paged_llm
from paged_llm import _core
from paged_llm._kv_index import (
    AllBlocksCleared,
    BlockIndex,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    ReplicaSubscriber,
)
from paged_llm._routing import KvEventsRouter
from test_routing import _Id
from test_routing import _Replica as _StandIn

BS = 16


def _stored(tokens: List[int], hashes: List[int], parent: Optional[int] = None) -> KVEventBatch:
    n = len(hashes)
    return KVEventBatch(ts=0.0, events=[BlockStored(hashes, parent, tokens[: n * BS], BS, None, "GPU")])


def test_an_index_matches_chains_of_blocks_and_forgets_removed_ones() -> None:
    tokens = list(range(100))
    index = BlockIndex()
    index.apply(_stored(tokens, [11, 12, 13]))
    assert index.match(tokens) == 3
    # A run stored later continues its chain from its parent.
    index.apply(KVEventBatch(0.0, [BlockStored([14], 13, tokens[48:64], BS, None, "GPU")]))
    assert index.match(tokens) == 4
    # The same tokens under another chain (another salt) do not extend this one.
    assert index.match([7] + tokens[1:]) == 0
    index.apply(KVEventBatch(0.0, [BlockRemoved([12], "GPU")]))
    assert index.match(tokens) == 1 and len(index) == 3
    index.apply(KVEventBatch(0.0, [BlockRemoved([999], "GPU"), BlockStored([21], None, tokens[:16], BS, 3, "CPU")]))
    assert len(index) == 3, "unknown removals and other media are ignored"
    # An adapter's chain of the same tokens is not the base model's.
    index.apply(KVEventBatch(0.0, [BlockStored([31, 32], None, [9] * 32, BS, 5, "GPU")]))
    assert index.match([9] * 32) == 0 and index.match([9] * 32, lora_id=5) == 2
    index.apply(KVEventBatch(0.0, [AllBlocksCleared()]))
    assert index.match(tokens) == 0 and len(index) == 0


def test_request_tokens_are_what_the_engine_admits(model_path: str, llm) -> None:
    tokenizer = _core.PromptTokenizer(model_path)
    text = "The capital of France is"
    body = json.dumps({"prompt": text, "max_tokens": 4}).encode()
    assert tokenizer.request_tokens("/v1/completions", body) == llm.tokenize(text)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    chat = tokenizer.request_tokens("/v1/chat/completions", json.dumps({"messages": messages}).encode())
    out = llm.chat(messages, paged_llm.SamplingParams(max_tokens=1))
    assert chat == out[0].prompt_token_ids
    assert tokenizer.request_tokens("/v1/embeddings", b"{}") is None
    assert tokenizer.request_tokens("/v1/completions", b"{not json") is None


class _Replica(_StandIn):
    def __init__(self, name: str, events: bool = True) -> None:
        super().__init__(name)
        self.routing_stats: Dict = {"kv_usage": 0.0}
        self.index = BlockIndex() if events else None


class _Sub:
    def __init__(self, index: BlockIndex) -> None:
        self.index = index


class _Request:
    def __init__(self, path: str, body: bytes) -> None:
        self.path, self.body, self.prompt, self.replica = path, body, body.decode(), None


class _Router(KvEventsRouter):
    """The router with queues set by the test and each stand-in's index as its subscriber."""

    def __init__(self, model: str, queues: Dict[str, int]) -> None:  # no Serve state: only `_rank` runs
        self._deployment_id = _Id("test")
        self.queues = queues
        self.initialize_state(model=model)

    def _queue_len(self, replica: _Replica) -> int:
        return self.queues[replica.replica_id.name]

    def _subscriber(self, replica: _Replica) -> Optional[_Sub]:
        return None if replica.index is None else _Sub(replica.index)

    def route(self, replicas: List[_Replica], body: bytes) -> str:
        return self._rank(replicas, _Request("/v1/chat/completions", body))[0][0].replica_id.name


def _chat(user: int, turns: int) -> bytes:
    messages = [{"role": "system", "content": f"You help user {user}. " + f"User {user} likes topic {user}. " * 20}]
    messages += [{"role": "user", "content": f"Question {t}?"} for t in range(turns)]
    return json.dumps({"messages": messages}).encode()


def test_routes_to_the_cache_that_holds_the_prompt_weighed_against_load(model_path: str) -> None:
    a, b = _Replica("a"), _Replica("b")
    router = _Router(model_path, {"a": 0, "b": 3})
    tokenizer = _core.PromptTokenizer(model_path)
    later = tokenizer.request_tokens("/v1/chat/completions", _chat(1, 3))
    first = tokenizer.request_tokens("/v1/chat/completions", _chat(1, 1))
    # `b` holds the conversation's first turn: its later turn goes there despite b's queue.
    b.index.apply(_stored(first, list(range(100, 100 + len(first) // BS))))
    assert router.route([a, b], _chat(1, 3)) == "b"
    assert b.index.match(later) == len(first) // BS
    # ... unless b's cache is nearly full and its queue far the longest: then a's room wins.
    router.queues["b"] = 16
    b.routing_stats["kv_usage"] = 0.95
    assert router.route([a, b], _chat(1, 3)) == "a"
    b.routing_stats["kv_usage"] = 0.0
    # New conversations (nobody holds a block of them) spread although b's queue sample is stale.
    router.queues.update({"a": 0, "b": 1})
    homes = {u: router.route([a, b], _chat(u, 1)) for u in range(10, 18)}
    assert list(homes.values()).count("a") == list(homes.values()).count("b") == 4
    # A retry, or a next turn before the first turn's blocks show up in the events, goes where
    # the first went; a prompt that only shares the chat template's opening spreads on.
    assert all(router.route([a, b], _chat(u, 1)) == home for u, home in homes.items())
    assert all(router.route([a, b], _chat(u, 2)) == home for u, home in homes.items())
    # Prompts that share all their full blocks and differ in the last, partial one are new
    # prompts each, not retries of one another.
    prompts = [f"{'word ' * 64}{i}" for i in range(4)]
    ids = [tokenizer.request_tokens("/v1/completions", json.dumps({"prompt": p}).encode()) for p in prompts]
    assert len({tuple(t[: len(t) // BS * BS]) for t in ids}) == 1 and len({tuple(t) for t in ids}) == 4
    bodies = [json.dumps({"prompt": p}).encode() for p in prompts]
    homes = [router._rank([a, b], _Request("/v1/completions", body))[0][0].replica_id.name for body in bodies]
    assert sorted(homes) == ["a", "a", "b", "b"]
    # Not a prompt: the shortest queue, and no conversation counted.
    new = dict(router._new)
    assert router._rank([a, b], _Request("/v1/models", b""))[0][0].replica_id.name == "a"
    assert router._new == new
    # A replica without events: the approximate policy decides, and sends a new prompt where
    # the fewest new prompts went (the events policy gave a and b four each).
    c = _Replica("c", events=False)
    router.queues["c"] = 0
    assert router.route([a, b, c], _chat(2, 1)) == "c"


def test_an_adapters_request_matches_only_blocks_stored_under_its_adapter(model_path: str) -> None:
    # Replica a holds the prompt under the base model, b under adapter "sql" (its id 7 there).
    a, b = _Replica("a"), _Replica("b")
    a.routing_stats["lora_ids"], b.routing_stats["lora_ids"] = {}, {"sql": 7}
    router = _Router(model_path, {"a": 0, "b": 0})
    tokenizer = _core.PromptTokenizer(model_path)
    messages = json.loads(_chat(2, 1))["messages"]

    def body(model: str) -> bytes:
        return json.dumps({"model": model, "messages": messages}).encode()

    tokens = tokenizer.request_tokens("/v1/chat/completions", body("base"))
    n = len(tokens) // BS
    a.index.apply(KVEventBatch(0.0, [BlockStored(list(range(100, 100 + n)), None, tokens[: n * BS], BS, None, "GPU")]))
    b.index.apply(KVEventBatch(0.0, [BlockStored(list(range(200, 200 + n)), None, tokens[: n * BS], BS, 7, "GPU")]))
    assert router.route([a, b], body("sql")) == "b", "the adapter's blocks are on b"
    assert router.route([a, b], body("base")) == "a", "the base model's blocks are on a"
    # c has the adapter (another id there) and nothing cached; a lacks the adapter: its base
    # blocks count for nothing, so the shorter queue wins, not a's cache.
    c = _Replica("c")
    c.routing_stats["lora_ids"] = {"sql": 1}
    router.queues.update(a=3, c=0)
    assert router.route([a, c], body("sql")) == "c"
    assert router.route([a, c], body("base")) == "a", "a's cache still draws the base model's request"


def test_a_subscriber_fills_gaps_from_replay_clears_what_it_cannot_and_starts_over_on_a_restart() -> None:
    """``ReplicaSubscriber`` against a stand-in publisher: an XPUB socket (which tells when the
    subscription has landed, so nothing is sent into the void) and a ROUTER answering replay
    requests from a buffer the test sets."""
    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    replay = ctx.socket(zmq.ROUTER)
    replay_port = replay.bind_to_random_port("tcp://127.0.0.1")
    encode = msgspec.msgpack.Encoder().encode
    buffer: Dict[int, bytes] = {}
    stop = threading.Event()

    def batch(i: int) -> bytes:
        return encode(KVEventBatch(0.0, [BlockStored([100 + i], None, [i] * BS, BS, None, "GPU")]))

    def serve_replay() -> None:
        while not stop.is_set():
            if replay.poll(20):
                identity, _, start = replay.recv_multipart()
                for seq in sorted(s for s in buffer if s >= int.from_bytes(start, "big")):
                    replay.send_multipart([identity, b"", seq.to_bytes(8, "big"), buffer[seq]])
                replay.send_multipart([identity, b"", (-1).to_bytes(8, "big", signed=True), b""])

    def send(seq: int, payload: bytes) -> None:
        pub.send_multipart([b"kv", seq.to_bytes(8, "big"), payload])

    def settles_at(want: Set[int]) -> bool:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and sub.index.hashes() != want:
            time.sleep(0.01)
        return sub.index.hashes() == want

    server = threading.Thread(target=serve_replay, daemon=True)
    server.start()
    sub = ReplicaSubscriber(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay_port}", "kv")
    try:
        assert pub.poll(10_000) and pub.recv() == b"\x01kv", "the subscription lands"
        # A late join: 0-3 only in the replay buffer, 4 the first live batch.
        buffer.update({s: batch(s) for s in range(5)})
        send(4, batch(4))
        assert settles_at({100, 101, 102, 103, 104})
        # A gap past the buffer (5 and 6 lost): cleared, then what replay and the stream still have.
        buffer.clear()
        buffer.update({s: batch(s) for s in (7, 8, 9)})
        send(9, batch(9))
        assert settles_at({107, 108, 109})
        # The publisher restarted (its sequence went back): the index starts over.
        send(0, batch(0))
        assert settles_at({100})
        # A batch it cannot read may have removed blocks: cleared.
        send(1, b"not msgpack")
        assert settles_at(set()) and sub.alive
    finally:
        stop.set()
        server.join()
        sub.close()
        pub.close(linger=0)
        replay.close(linger=0)
        ctx.term()
