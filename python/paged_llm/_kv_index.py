"""What each replica's prefix cache holds, rebuilt from its KV cache events (vLLM's wire
format: ZMQ PUB frames ``(topic, seq, msgpack KVEventBatch)`` and a replay socket), for the
``KvEventsRouter``.

A published block hash is opaque (seeded per process, as vLLM's is), so the index is keyed
the way ``BlockStored`` describes a block: ``(lora_id, parent hash, the block's token ids)``. A
prompt of the base model matches a replica's cache by walking that chain from the root block by
block (``lora_id`` None); the walk's length is the number of the prompt's full blocks the replica
can serve from its cache. Blocks of a request with a ``cache_salt`` chain like the base model's
from their second block on only (their parents differ), so only their first block can be
counted for a base prompt with the same tokens.

The index may lack blocks (batches lost beyond replay clear it), never keep ones it was told
are gone.

Needs ``pyzmq`` and ``msgspec`` (``pip install "paged-llm[ray]"``); imported only by the router.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple, Union

import msgspec
import zmq

Key = Tuple[Optional[int], Optional[int], Tuple[int, ...]]


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
    """One replica's cached blocks (``medium`` GPU), keyed by ``(lora_id, parent hash, token ids)``."""

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
                        key = (event.lora_id, parent, tuple(event.token_ids[i * bs : (i + 1) * bs]))
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
                    self._forget_all()

    def clear(self) -> None:
        with self._lock:
            self._forget_all()

    def _forget_all(self) -> None:
        self._children.clear()
        self._key_of.clear()

    def match(self, tokens: Sequence[int], lora_id: Optional[int] = None) -> int:
        """How many of ``tokens``' leading full blocks the cache holds, in chain order, under
        adapter ``lora_id`` (None: the base model)."""
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
                    nxt.update(self._children.get((lora_id, parent, block), ()))
                if not nxt:
                    break
                frontier = nxt
                matched += 1
            return matched


class ReplicaSubscriber:
    """Follows one replica's events on a daemon thread into a ``BlockIndex``: live batches from
    the PUB socket, and on a gap (a late join, batches a full queue dropped) the missing ones
    from the replay socket, so the index applies every batch once, in order. A gap replay cannot
    fill clears the index; a sequence number going back (the replica's publisher restarted)
    starts it over; a thread that stopped on an error marks the subscriber dead (``alive``)."""

    def __init__(self, endpoint: str, replay_endpoint: Optional[str], topic: str = "") -> None:
        self.index = BlockIndex()
        self.endpoint = endpoint
        self.alive = True
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
        try:
            sub.connect(self.endpoint)
            sub.setsockopt(zmq.SUBSCRIBE, self._topic)
            while not self._stop.is_set():
                if not sub.poll(100):
                    continue
                frames = sub.recv_multipart()
                if len(frames) != 3 or len(frames[1]) != 8:
                    continue
                seq = int.from_bytes(frames[1], "big")
                if seq < self._next_seq:
                    self.index.clear()
                    self._next_seq = 0
                if seq > self._next_seq:
                    self._replay(seq)
                self._apply(seq, frames[2])
        except Exception:  # a broken socket or peer: the router stops trusting this index
            self.alive = False
        finally:
            sub.close(linger=0)

    def _apply(self, seq: int, payload: bytes) -> None:
        try:
            self.index.apply(_DECODER.decode(payload))
        except msgspec.DecodeError:
            self.index.clear()  # a batch it cannot read may have removed blocks
        self._next_seq = seq + 1

    def _replay(self, upto: int) -> None:
        """Applies batches ``_next_seq .. upto - 1`` from the replay socket. Batches it no longer
        holds (or no replay socket, or no answer) leave a gap: the index is cleared, and the
        batches after the gap still applied (it may then lack blocks, never keep removed ones)."""
        complete = False
        if self._replay_endpoint is not None:
            dealer = self._ctx.socket(zmq.DEALER)
            dealer.connect(self._replay_endpoint)
            try:
                dealer.send_multipart([b"", self._next_seq.to_bytes(8, "big")])
                while dealer.poll(2000):
                    frames = dealer.recv_multipart()
                    if len(frames) != 3 or len(frames[1]) != 8:
                        break
                    seq = int.from_bytes(frames[1], "big", signed=True)
                    if seq == _END or seq >= upto:
                        break
                    if seq != self._next_seq:
                        # The buffer starts past what was missed.
                        self.index.clear()
                    self._apply(seq, frames[2])
                complete = self._next_seq == upto
            finally:
                dealer.close(linger=0)
        if not complete:
            self.index.clear()
        self._next_seq = upto
