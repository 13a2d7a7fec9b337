"""What each replica's prefix cache holds, rebuilt from its KV cache events (vLLM's wire
format: ZMQ PUB frames ``(topic, seq, msgpack KVEventBatch)`` and a replay socket), for the
``KvEventsRouter``.

A published block hash is opaque (seeded per process, as vLLM's is), so the index is keyed
the way ``BlockStored`` describes a block: ``(parent hash, the block's token ids)``. A prompt
matches a replica's cache by walking that chain from the root block by block; the walk's
length is the number of the prompt's full blocks the replica can serve from its cache.

Needs ``pyzmq`` and ``msgspec`` (``pip install "paged-llm[ray]"``); imported only by the router.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple, Union

import msgspec
import zmq

Key = Tuple[Optional[int], Tuple[int, ...]]


class _EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: List[Any]


class _Event(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(_Event):
    block_hashes: List[int]
    parent_block_hash: Optional[int]
    token_ids: List[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]


class BlockRemoved(_Event):
    block_hashes: List[int]
    medium: Optional[str]


class AllBlocksCleared(_Event):
    pass


class KVEventBatch(_EventBatch):
    events: List[Union[BlockStored, BlockRemoved, AllBlocksCleared]]


_DECODER = msgspec.msgpack.Decoder(type=KVEventBatch)
#: The replay socket's end-of-stream sequence number.
_END = -1


class BlockIndex:
    """One replica's cached blocks (``medium`` GPU), keyed by ``(parent hash, token ids)``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._children: Dict[Key, Set[int]] = {}
        self._key_of: Dict[int, Key] = {}
        self.block_size = 0

    def __len__(self) -> int:
        return len(self._key_of)

    def hashes(self) -> Set[int]:
        with self._lock:
            return set(self._key_of)

    def apply(self, batch: KVEventBatch) -> None:
        with self._lock:
            for event in batch.events:
                if isinstance(event, BlockStored):
                    if event.medium not in (None, "GPU"):
                        continue
                    bs = self.block_size = event.block_size
                    parent = event.parent_block_hash
                    for i, h in enumerate(event.block_hashes):
                        key = (parent, tuple(event.token_ids[i * bs : (i + 1) * bs]))
                        self._children.setdefault(key, set()).add(h)
                        self._key_of[h] = key
                        parent = h
                elif isinstance(event, BlockRemoved):
                    if event.medium not in (None, "GPU"):
                        continue
                    for h in event.block_hashes:
                        key = self._key_of.pop(h, None)
                        if key is not None:
                            held = self._children[key]
                            held.discard(h)
                            if not held:
                                del self._children[key]
                else:
                    self._children.clear()
                    self._key_of.clear()

    def match(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens``' leading full blocks the cache holds, in chain order."""
        bs = self.block_size
        if bs == 0:
            return 0
        with self._lock:
            frontier: Set[Optional[int]] = {None}
            matched = 0
            for start in range(0, len(tokens) - bs + 1, bs):
                block = tuple(tokens[start : start + bs])
                nxt: Set[Optional[int]] = set()
                for parent in frontier:
                    nxt.update(self._children.get((parent, block), ()))
                if not nxt:
                    break
                frontier = nxt
                matched += 1
            return matched


class ReplicaSubscriber:
    """Follows one replica's events on a daemon thread into a ``BlockIndex``: live batches from
    the PUB socket, and on a gap (a late join, batches a full queue dropped) the missing ones
    from the replay socket, so the index applies every batch exactly once, in order."""

    def __init__(self, endpoint: str, replay_endpoint: Optional[str], topic: str = "kv-events") -> None:
        self.index = BlockIndex()
        self.endpoint = endpoint
        self.last_event = time.monotonic()
        self._replay_endpoint = replay_endpoint
        self._topic = topic.encode()
        self._next_seq = 0
        self._stop = threading.Event()
        self._ctx = zmq.Context()
        self._thread = threading.Thread(target=self._run, name=f"kv-events {endpoint}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._ctx.term()

    def _run(self) -> None:
        sub = self._ctx.socket(zmq.SUB)
        sub.connect(self.endpoint)
        sub.setsockopt(zmq.SUBSCRIBE, self._topic)
        try:
            while not self._stop.is_set():
                if not sub.poll(100):
                    continue
                frames = sub.recv_multipart()
                if len(frames) != 3:
                    continue
                seq = int.from_bytes(frames[1], "big")
                if seq > self._next_seq:
                    self._replay(seq)
                if seq == self._next_seq:
                    self._apply(seq, frames[2])
        finally:
            sub.close(linger=0)

    def _apply(self, seq: int, payload: bytes) -> None:
        try:
            batch = _DECODER.decode(payload)
        except msgspec.DecodeError:
            batch = None
        if batch is not None:
            self.index.apply(batch)
        self._next_seq = seq + 1
        self.last_event = time.monotonic()

    def _replay(self, upto: int) -> None:
        """Applies batches ``_next_seq .. upto - 1`` from the replay socket; what it no longer
        holds is skipped (the index may then lack blocks, never hold ones that are gone: a
        later ``BlockRemoved`` of an unknown hash is ignored)."""
        if self._replay_endpoint is None:
            self._next_seq = upto
            return
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.connect(self._replay_endpoint)
        try:
            dealer.send_multipart([b"", self._next_seq.to_bytes(8, "big")])
            while dealer.poll(2000):
                _, seq_bytes, payload = dealer.recv_multipart()
                seq = int.from_bytes(seq_bytes, "big", signed=True)
                if seq == _END or seq >= upto:
                    break
                if seq >= self._next_seq:
                    self._apply(seq, payload)
        finally:
            dealer.close(linger=0)
        self._next_seq = upto
