"""KV cache events from the package's engine, read as a vLLM subscriber reads them: libzmq
(pyzmq) sockets and the msgspec types of vLLM's documented subscriber
(``examples/online_serving/kv_events_subscriber.py``: array-like structs, events tagged by
class name), written here from that schema alone. The oracle is the engine's own prefix
cache: the set of hashes the events build must be exactly the set it holds."""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from typing import Any, Dict, List, Optional, Set, Union

import msgspec
import pytest
import zmq

import paged_llm


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: List[Any]


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base class of the events."""


class BlockStored(KVCacheEvent):
    block_hashes: List[int]
    parent_block_hash: Optional[int]
    token_ids: List[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]


class BlockRemoved(KVCacheEvent):
    block_hashes: List[int]
    medium: Optional[str]


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: List[Union[BlockStored, BlockRemoved, AllBlocksCleared]]


DECODER = msgspec.msgpack.Decoder(type=KVEventBatch)
TOPIC = "kv-events"
EVENTS = {
    "enable_kv_cache_events": True,
    "endpoint": "tcp://127.0.0.1:0",
    "replay_endpoint": "tcp://127.0.0.1:0",
    "topic": TOPIC,
}


class Subscriber:
    """Collects live batches by sequence number on a thread of its own."""

    def __init__(self, ctx: zmq.Context, endpoint: str) -> None:
        self.batches: Dict[int, bytes] = {}
        self._stop = threading.Event()
        self._sub = ctx.socket(zmq.SUB)
        self._sub.connect(endpoint)
        self._sub.setsockopt_string(zmq.SUBSCRIBE, TOPIC)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._sub.poll(50):
                topic, seq, payload = self._sub.recv_multipart()
                assert topic == TOPIC.encode()
                self.batches[int.from_bytes(seq, "big")] = payload

    def stop(self) -> Dict[int, bytes]:
        time.sleep(0.3)  # what is in flight
        self._stop.set()
        self._thread.join()
        self._sub.close(linger=0)
        return self.batches


def replay(ctx: zmq.Context, endpoint: str, start: int) -> Dict[int, bytes]:
    """Every buffered batch from ``start`` on, through the replay socket (a DEALER, so that one
    request takes the many answers; it sends the empty frame a REQ socket would)."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(endpoint)
    dealer.send_multipart([b"", start.to_bytes(8, "big")])
    got: Dict[int, bytes] = {}
    try:
        while True:
            assert dealer.poll(10_000), "no replay answer in 10 s"
            empty, seq, payload = dealer.recv_multipart()
            assert empty == b""
            if int.from_bytes(seq, "big", signed=True) == -1:
                assert payload == b""
                return got
            got[int.from_bytes(seq, "big")] = payload
    finally:
        dealer.close(linger=0)


def rebuild(batches: Dict[int, bytes]) -> Dict[str, Set[int]]:
    """The hashes each medium holds after applying every batch in sequence order (which must
    have no gap)."""
    assert sorted(batches) == list(range(len(batches))), "batches from 0 without a gap"
    cached: Dict[str, Set[int]] = {"GPU": set(), "CPU": set()}
    for seq in sorted(batches):
        for event in DECODER.decode(batches[seq]).events:
            if isinstance(event, BlockStored):
                held = cached[event.medium]
                assert event.block_size == 16 and len(event.token_ids) == 16 * len(event.block_hashes)
                assert not held & set(event.block_hashes), "stored twice"
                held.update(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                held = cached[event.medium]
                assert set(event.block_hashes) <= held, "removed but never stored"
                held.difference_update(event.block_hashes)
            else:
                cached["GPU"].clear()
    return cached


def held(llm: paged_llm.LLM) -> Dict[str, Set[int]]:
    return {medium: set(llm.cached_block_hashes(medium)) for medium in ("GPU", "CPU")}


def workload(n: int) -> List[str]:
    system = "You are a terse assistant for a shipping company. " * 6
    return [system + f"Customer {i} asks where parcel number {1000 + 37 * i} is today." for i in range(n)]


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_a_subscriber_rebuilds_the_prefix_cache_through_evictions_preemption_and_replay(model_path: str, mode: str) -> None:
    ctx = zmq.Context()
    params = paged_llm.SamplingParams(max_tokens=24, ignore_eos=True, temperature=0.0)
    with paged_llm.LLM(model_path, num_kv_blocks=24, preemption_mode=mode, kv_events_config=EVENTS) as llm:
        endpoint, replay_endpoint = llm.kv_events_endpoints()
        live = Subscriber(ctx, endpoint)
        time.sleep(0.2)
        llm.generate(workload(12), params)
        batches = live.stop()
        metrics = llm.metrics()
        assert metrics["num_preemptions"] > 0, f"{mode}: 24 blocks for 12 prompts should preempt"
        want = held(llm)
        assert want["GPU"]
        # What the live socket missed (before the subscription landed, or dropped), by replay.
        first = min(batches, default=0)
        batches.update({s: p for s, p in replay(ctx, replay_endpoint, 0).items() if s < first})
        assert rebuild(batches) == want
        # A subscriber that joins after everything rebuilds the same sets from replay alone.
        assert rebuild(replay(ctx, replay_endpoint, 0)) == want
        # Swapped-out sequences' registered blocks appear on the CPU medium, and only then.
        cpu_events = [
            e
            for p in batches.values()
            for e in DECODER.decode(p).events
            if not isinstance(e, AllBlocksCleared) and e.medium == "CPU"
        ]
        assert bool(cpu_events) == (mode == "swap"), f"{mode}: {len(cpu_events)} CPU events"
    ctx.term()


def test_garbage_on_the_replay_socket_gets_nothing_and_the_engine_keeps_serving(model_path: str) -> None:
    ctx = zmq.Context()
    params = paged_llm.SamplingParams(max_tokens=4, temperature=0.0)
    with paged_llm.LLM(model_path, num_kv_blocks=64, kv_events_config=EVENTS) as llm:
        _, replay_endpoint = llm.kv_events_endpoints()
        llm.generate(workload(2), params)
        host, port = replay_endpoint.removeprefix("tcp://").rsplit(":", 1)
        # Not even ZMTP: raw bytes, then a hang-up.
        with socket.create_connection((host, int(port)), timeout=5) as raw:
            raw.sendall(os.urandom(512))
        # ZMTP, but no request a replay socket knows: no answer.
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(replay_endpoint)
        for frames in ([b"garbage"], [b"", b"short"], [b"", b"x" * 8, b"extra"]):
            dealer.send_multipart(frames)
        assert not dealer.poll(500), "garbage was answered"
        dealer.close(linger=0)
        out = llm.generate(workload(3), params)
        assert all(o.outputs[0].token_ids for o in out)
        assert rebuild(replay(ctx, replay_endpoint, 0)) == held(llm)
    ctx.term()


def test_bad_configs_are_errors_naming_the_field(model_path: str) -> None:
    for config, names in (
        ({"enable_kv_cache_events": True, "endpont": "tcp://*:5557"}, "endpont"),
        ({"enable_kv_cache_events": True, "endpoint": "udp://x:1"}, "endpoint"),
    ):
        with pytest.raises(ValueError, match=names):
            paged_llm.LLM(model_path, num_kv_blocks=16, kv_events_config=config)
    with pytest.raises(paged_llm.EngineError, match="prefix caching"):
        paged_llm.LLM(model_path, num_kv_blocks=16, enable_prefix_caching=False, kv_events_config=EVENTS)
    with paged_llm.LLM(model_path, num_kv_blocks=16, kv_events_config=EVENTS) as first:
        taken = first.kv_events_endpoints()[1]
        with pytest.raises(paged_llm.EngineError, match=re.escape(taken)):
            paged_llm.LLM(model_path, num_kv_blocks=16, kv_events_config={**EVENTS, "replay_endpoint": taken})
