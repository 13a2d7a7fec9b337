"""The prefix-aware router's choices, without a cluster: its ``_rank`` over stand-in replicas
whose queue lengths the test sets (Serve's cache of them is a sample, stale while a burst of
requests is being routed)."""

from __future__ import annotations

from collections import Counter
from typing import Dict, List

from paged_llm._routing import CHUNK_CHARS, PrefixAffinityRouter


class _Id:
    def __init__(self, name: str) -> None:
        self.name = name

    def to_full_id_str(self) -> str:
        return self.name


class _Replica:
    def __init__(self, name: str) -> None:
        self.replica_id = _Id(name)


class _Request:
    def __init__(self, prompt: str) -> None:
        self.prompt, self.replica = prompt, None


class _Router(PrefixAffinityRouter):
    """The router with queue lengths set by the test instead of Serve's probes."""

    def __init__(self, queues: Dict[str, int]) -> None:  # no Serve state: only `_rank` runs
        self.queues = queues
        self.initialize_state()

    def _queue_len(self, replica: _Replica) -> int:
        return self.queues[replica.replica_id.name]

    def route(self, replicas: List[_Replica], prompt: str) -> str:
        ranked = self._rank(replicas, _Request(prompt))
        return ranked[0][0].replica_id.name


def _conversation(user: int, turns: int) -> str:
    system = f"You are the assistant of user {user}. " + " ".join(f"word{user}-{i}" for i in range(80))
    return system + "".join(f" Turn {t}: a question and its answer." for t in range(turns))


def test_a_burst_of_new_conversations_spreads_evenly_over_stale_queue_lengths():
    replicas = [_Replica("a"), _Replica("b")]
    # Serve last saw one request queued at `a` and none at `b`, and does not update that while
    # the burst is routed: by queue length alone every new conversation would go to `b`.
    router = _Router({"a": 1, "b": 0})
    first = Counter(router.route(replicas, _conversation(u, 1)) for u in range(8))
    assert first == Counter({"a": 4, "b": 4})


def test_a_later_turn_goes_where_its_conversation_went_while_queues_allow():
    replicas = [_Replica("a"), _Replica("b")]
    router = _Router({"a": 0, "b": 0})
    homes = {u: router.route(replicas, _conversation(u, 1)) for u in range(6)}
    assert len(_conversation(0, 1)) > 4 * CHUNK_CHARS, "the prompts span several chunks"
    # In another order than the first turns', so that no rotation of new prompts lands there.
    for u in [5, 3, 4, 0, 1, 2]:
        assert router.route(replicas, _conversation(u, 3)) == homes[u], f"user {u}"
    # Past the imbalance threshold (8 by default) the least loaded replica takes it instead.
    router.queues.update({"a": 20, "b": 0})
    moved = [u for u, home in homes.items() if home == "a"]
    assert moved and all(router.route(replicas, _conversation(u, 4)) == "b" for u in moved)
