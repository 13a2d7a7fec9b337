"""Ray Serve request routers for ``paged_llm.serve``'s replicas (``RequestRouter`` subclasses,
run inside each process that holds a handle to the replicas, usually the ingress).

``PrefixAffinityRouter``: a request whose prompt begins with what a replica recently served
goes to that replica (its prefix cache likely still holds the prompt's KV blocks) while that
replica's queue allows; a prompt nobody served goes, while the queues are within the threshold
of each other, to the replica that was given the fewest new prompts (then the least recorded
text), so that new conversations spread; past the threshold, to the least loaded replica. The policy of Ray Serve LLM's prefix-cache-affinity router, kept in this process (no
tree actor, no blocking call in the routing loop). ``KvEventsRouter``: the same decisions made
on what each replica's cache really holds, rebuilt from its KV cache events
(``_kv_index``), the prompt tokenized as the replica will tokenize it, and each candidate scored
as llm-d's scorers weigh them: the cached fraction of the prompt against the replica's queue
and KV usage; the approximate policy where a replica publishes no events. ``RoundRobinRouter``:
the baseline the prefix figures compare with. All honour a pin (``ForwardedRequest.replica``):
how one replica's own metrics are read.

Imports Ray: Serve imports this module where it builds a router, never ``import paged_llm``.
"""

from __future__ import annotations

import collections
import json
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

#: Prompts are compared in chunks of this many characters (a KV block holds 16 tokens, some
#: 60 characters of English: a chunk spans about two blocks).
CHUNK_CHARS = 128
#: A prompt is recorded up to this many chunks (a long prompt's tail decides nothing).
MAX_CHUNKS = 256

#: Replica ids each router of this process last saw, by deployment name (what the ingress
#: asks each replica's metrics of).
_KNOWN_REPLICAS: Dict[str, List[str]] = {}


#: The KV-events routers' subscribers of this process, by deployment name (what the ingress
#: reports at ``/replicas/kv_index``).
_SUBSCRIBERS: Dict[str, Dict[str, Any]] = {}


#: How long the events router waits before following again a replica whose subscriber died.
RESTART_S = 5.0


def indexed_blocks(deployment: str) -> Dict[str, int]:
    """Blocks each replica's events say it caches, by replica id, as this process's router has them."""
    return {rid: len(sub.index) for rid, sub in list(_SUBSCRIBERS.get(deployment, {}).items())}


def known_replicas(deployment: str) -> List[str]:
    """The full ids of the replicas of ``deployment`` that this process's router routes to."""
    return list(_KNOWN_REPLICAS.get(deployment, []))


def _chained(items: Sequence[Any], size: int) -> List[int]:
    """Chained hashes of the whole ``size``-long pieces of ``items`` (a str or a tuple): equal up
    to k iff the first k pieces are."""
    hashes: List[int] = []
    h = 0
    for start in range(0, len(items) - size + 1, size):
        h = hash((h, items[start : start + size]))
        hashes.append(h)
    return hashes


def chunk_hashes(text: str) -> List[int]:
    """Chained hashes of the prompt's whole chunks (up to ``MAX_CHUNKS``)."""
    return _chained(text[: CHUNK_CHARS * MAX_CHUNKS], CHUNK_CHARS)


def _forwarded(pending: Optional[PendingRequest]) -> Any:
    """The request's ``ForwardedRequest`` (anything with ``prompt`` and ``replica``), if any."""
    if pending is None:
        return None
    for arg in pending.args or ():
        if hasattr(arg, "prompt") and hasattr(arg, "replica"):
            return arg
    return None


class _PinningRouter(RequestRouter):
    """Routes a pinned request to its replica; the rest by ``_rank``."""

    async def choose_replicas(
        self,
        candidate_replicas: List[RunningReplica],
        pending_request: Optional[PendingRequest] = None,
    ) -> List[List[RunningReplica]]:
        request = _forwarded(pending_request)
        pin = getattr(request, "replica", None)
        if pin is not None:
            pinned = [r for r in candidate_replicas if r.replica_id.to_full_id_str() == pin]
            # A pin to a replica that is gone is answered by another; the caller checks who.
            return [pinned] if pinned else [candidate_replicas]
        if not candidate_replicas:
            return []
        return self._rank(candidate_replicas, request)

    def update_replicas(self, replicas: List[RunningReplica]) -> None:
        super().update_replicas(replicas)
        ids = sorted(r.replica_id.to_full_id_str() for r in replicas)
        # Through the module as imported, not this class's globals: Serve may ship a router
        # class by value, and its copy's globals are not the module the ingress reads.
        from paged_llm import _routing

        _routing._KNOWN_REPLICAS[self._deployment_id.name] = ids

    def _queue_len(self, replica: RunningReplica) -> int:
        known = self.replica_queue_len_cache.get(replica.replica_id)
        return 0 if known is None else known

    def _rank(self, candidates: List[RunningReplica], request: Any) -> List[List[RunningReplica]]:
        raise NotImplementedError


class RoundRobinRouter(_PinningRouter):
    """Each request to the next replica in turn (the next after it when that one is full)."""

    def initialize_state(self, **kwargs: Any) -> None:
        self._turn = 0

    def _rank(self, candidates: List[RunningReplica], request: Any) -> List[List[RunningReplica]]:
        ordered = sorted(candidates, key=lambda r: r.replica_id.to_full_id_str())
        first = self._turn % len(ordered)
        self._turn += 1
        ordered = ordered[first:] + ordered[:first]
        return [[ordered[0]], ordered[1:]]


class PrefixAffinityRouter(_PinningRouter):
    """The replica that served the longest prefix of the prompt while its queue is within
    ``imbalanced_threshold`` requests of the shortest, else the least loaded (see the module)."""

    def initialize_state(self, imbalanced_threshold: int = 8, max_chunks_per_replica: int = 16384) -> None:
        self._imbalanced_threshold = imbalanced_threshold
        self._max_chunks = max_chunks_per_replica
        #: Replica id -> the chunk hashes it served, least recently served first.
        self._served: Dict[str, "collections.OrderedDict[int, None]"] = {}
        #: Replica id -> how many unmatched prompts it was given (spreads short prompts).
        self._new: Dict[str, int] = collections.Counter()

    def _rank(self, candidates: List[RunningReplica], request: Any) -> List[List[RunningReplica]]:
        hashes = chunk_hashes(str(getattr(request, "prompt", "") or ""))
        queues = {r.replica_id: self._queue_len(r) for r in candidates}
        shortest = min(queues.values())
        best, best_match = None, 0
        for replica in candidates:
            served = self._served.get(replica.replica_id.to_full_id_str(), {})
            match = 0
            for h in hashes:
                if h not in served:
                    break
                match += 1
            if match > best_match and queues[replica.replica_id] - shortest <= self._imbalanced_threshold:
                best, best_match = replica, match

        def load(r: RunningReplica) -> Any:
            rid = r.replica_id.to_full_id_str()
            return (queues[r.replica_id], len(self._served.get(rid, ())), self._new[rid])

        def holdings(r: RunningReplica) -> Any:
            rid = r.replica_id.to_full_id_str()
            return (self._new[rid], len(self._served.get(rid, ())), queues[r.replica_id])

        by_load = sorted(candidates, key=load)
        if best is None:
            # Queue lengths are a cached sample, stale while a burst of new prompts is routed:
            # while they are balanced, a new prompt goes where the fewest new prompts went, so
            # that conversations (and their later turns' cache hits) spread evenly.
            balanced = max(queues.values()) - shortest <= self._imbalanced_threshold
            best = min(candidates, key=holdings) if balanced else by_load[0]
            # Counted now, not when routed: the next new prompt, routed before this one lands,
            # then sees this replica as holding more and goes to another.
            self._record(best.replica_id, hashes)
            self._new[best.replica_id.to_full_id_str()] += 1
        return [[best], [r for r in by_load if r is not best]]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        request = _forwarded(pending_request)
        if request is not None and request.replica is None:
            self._record(replica_id, chunk_hashes(str(request.prompt or "")))

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._served.pop(replica_id.to_full_id_str(), None)

    def _record(self, replica_id: ReplicaID, hashes: List[int]) -> None:
        served = self._served.setdefault(replica_id.to_full_id_str(), collections.OrderedDict())
        for h in hashes:
            served[h] = None
            served.move_to_end(h)
        while len(served) > self._max_chunks:
            served.popitem(last=False)


def _request_model(body: bytes) -> Optional[str]:
    """The ``model`` a request's JSON body names (a LoRA adapter's name, or the base's), if any."""
    try:
        model = json.loads(body).get("model")
    except (ValueError, AttributeError):
        return None
    return model if isinstance(model, str) else None


class KvEventsRouter(PrefixAffinityRouter):
    """Routes on each replica's real cache contents (see the module): the replica with the best
    ``prefix_weight * cached fraction + queue_weight * (1 - queue / max(longest queue,
    imbalanced_threshold)) + kv_weight * (1 - KV usage)``, the cached fraction counting only the
    blocks stored under the request's LoRA adapter (by the id each replica's routing stats give
    its name; none for the base model). A prompt no replica holds a block of
    goes where a prompt whose full blocks all begin it was sent in the last ``recent_s`` seconds
    (a retry of the same request, or a conversation's next turn that came before its first
    turn's events), else, while queues are balanced, where the fewest new prompts went (then the
    shorter queue). A request that is not a completion or chat goes to the shortest queue. Falls
    back to ``PrefixAffinityRouter`` for a request it cannot tokenize or while a candidate
    publishes no events. A replica's index is dropped when it leaves the deployment or dies."""

    def initialize_state(
        self,
        model: str = "",
        prefix_weight: float = 3.0,
        queue_weight: float = 2.0,
        kv_weight: float = 1.0,
        imbalanced_threshold: int = 8,
        recent_s: float = 10.0,
    ) -> None:
        super().initialize_state(imbalanced_threshold=imbalanced_threshold)
        from paged_llm import _core

        self._tokenizer = _core.PromptTokenizer(model) if model else None
        self._weights = (prefix_weight, queue_weight, kv_weight)
        self._recent_s = recent_s
        #: The chained hash of all the full blocks of a prompt nobody held -> (replica id, when it
        #: was sent there, a hash of its whole token list), oldest first.
        self._recent: "collections.OrderedDict[int, Tuple[str, float, int]]" = collections.OrderedDict()
        #: Replica id -> when its subscriber was found dead (restarted after `RESTART_S`).
        self._dead: Dict[str, float] = {}
        self._subscribers: Dict[str, Any] = {}
        # Through the module as imported (see `update_replicas` above).
        from paged_llm import _routing

        _routing._SUBSCRIBERS[self._deployment_id.name] = self._subscribers

    def update_replicas(self, replicas: List[RunningReplica]) -> None:
        super().update_replicas(replicas)
        live = {r.replica_id.to_full_id_str() for r in replicas}
        for rid in [rid for rid in self._subscribers if rid not in live]:
            self._drop(rid)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._drop(replica_id.to_full_id_str())

    def _drop(self, rid: str) -> None:
        sub = self._subscribers.pop(rid, None)
        if sub is not None:
            # Joining its thread takes up to a poll interval: not on the routing loop.
            import threading

            threading.Thread(target=sub.close, daemon=True).start()

    def _subscriber(self, replica: RunningReplica) -> Any:
        """The replica's subscriber, started once its routing stats name its event sockets and
        started again (after `RESTART_S`) when its thread stopped on an error; ``None`` while
        there is none."""
        rid = replica.replica_id.to_full_id_str()
        sub = self._subscribers.get(rid)
        if sub is not None and not sub.alive:
            self._drop(rid)
            self._dead[rid], sub = time.monotonic(), None
        stats = replica.routing_stats or {}
        endpoint = stats.get("kv_events_endpoint")
        if sub is None and endpoint and time.monotonic() - self._dead.get(rid, -RESTART_S) >= RESTART_S:
            from ._kv_index import ReplicaSubscriber

            replay, topic = stats.get("kv_events_replay"), stats.get("kv_events_topic", "")
            sub = self._subscribers[rid] = ReplicaSubscriber(endpoint, replay, topic)
        return sub

    def _rank(self, candidates: List[RunningReplica], request: Any) -> List[List[RunningReplica]]:
        subs = {r.replica_id: self._subscriber(r) for r in candidates}
        path, body = getattr(request, "path", ""), getattr(request, "body", b"")
        if not str(getattr(request, "prompt", "") or ""):
            # Not a completion or chat (`/v1/models`, `/health`, embeddings): the least loaded
            # replica, counted nowhere (a new conversation's count is for spreading conversations).
            return [sorted(candidates, key=self._queue_len)]
        tokens = self._tokenizer.request_tokens(path, body) if self._tokenizer and body else None
        if tokens is None or any(s is None for s in subs.values()):
            return super()._rank(candidates, request)
        queues = {r.replica_id: self._queue_len(r) for r in candidates}
        longest, shortest = max(queues.values()), min(queues.values())
        block_size = max((s.index.block_size for s in subs.values()), default=0) or 16
        blocks = max(1, len(tokens) // block_size)
        # A request under an adapter matches only the blocks stored under that adapter's id on
        # each replica (ids are each replica's own); one a replica lacks matches nothing there.
        model = _request_model(body)
        lora_ids = {r.replica_id: (r.routing_stats or {}).get("lora_ids") or {} for r in candidates}
        is_adapter = any(model in ids for ids in lora_ids.values())

        def cached(r: RunningReplica) -> int:
            ids = lora_ids[r.replica_id]
            if model not in ids:
                return 0 if is_adapter else subs[r.replica_id].index.match(tokens)
            return subs[r.replica_id].index.match(tokens, lora_id=ids[model])

        matched = {r.replica_id: cached(r) for r in candidates}
        usage = {r.replica_id: float((r.routing_stats or {}).get("kv_usage", 0.0)) for r in candidates}
        prefix_w, queue_w, kv_w = self._weights
        # Queues relative to what counts as imbalanced, so that 2 against 1 is not all or nothing.
        scale = max(longest, self._imbalanced_threshold, 1)

        def score(r: RunningReplica) -> float:
            queue_free = 1.0 - queues[r.replica_id] / scale
            return prefix_w * matched[r.replica_id] / blocks + queue_w * queue_free + kv_w * (1.0 - usage[r.replica_id])

        def new_prompts(r: RunningReplica) -> Any:
            # Fewest new conversations first; between equals, the one with less running now.
            return (self._new[r.replica_id.to_full_id_str()], queues[r.replica_id], usage[r.replica_id])

        by_load = sorted(candidates, key=lambda r: (queues[r.replica_id], usage[r.replica_id]))
        balanced = longest - shortest <= self._imbalanced_threshold
        if max(matched.values()) == 0 and balanced:
            chain, whole = _chained(tuple(tokens), block_size), hash(tuple(tokens))
            best = self._recently_sent(chain, whole, candidates)
            if best is None:
                # Nobody holds any of it: spread new conversations (queue samples lag a burst).
                best = min(candidates, key=new_prompts)
                self._new[best.replica_id.to_full_id_str()] += 1
            if chain:
                self._remember(chain[-1], whole, best)
        else:
            best = max(candidates, key=lambda r: (score(r), -queues[r.replica_id]))
        return [[best], [r for r in by_load if r is not best]]

    def _recently_sent(self, chain: List[int], whole: int, candidates: List[RunningReplica]) -> Optional[RunningReplica]:
        """Where a recent prompt went whose full blocks all begin this one and are fewer (its
        next turn), or which is this very prompt (a retry), if anywhere. Two prompts that share
        only their full blocks (short prompts behind one system prompt) are not the same."""
        now = time.monotonic()
        while self._recent and next(iter(self._recent.values()))[1] < now - self._recent_s:
            self._recent.popitem(last=False)
        for i in reversed(range(len(chain))):
            rid, _, sent = self._recent.get(chain[i], ("", 0.0, 0))
            if i == len(chain) - 1 and sent != whole:
                continue
            best = next((r for r in candidates if r.replica_id.to_full_id_str() == rid), None)
            if best is not None:
                return best
        return None

    def _remember(self, key: int, whole: int, replica: RunningReplica) -> None:
        self._recent[key] = (replica.replica_id.to_full_id_str(), time.monotonic(), whole)
        self._recent.move_to_end(key)
        while len(self._recent) > self._max_chunks:
            self._recent.popitem(last=False)
