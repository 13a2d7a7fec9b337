"""Ray Data: the offline-batch example (``python/examples/ray_data_batch.py``) on a local
two-node cluster answers every prompt of a 200-prompt dataset exactly once, with an engine
per actor on each node."""

from __future__ import annotations

import collections

import ray_data_batch


def test_map_batches_answers_every_prompt_once_on_both_nodes(ray_cluster, model_path):
    import ray

    rows = ray_data_batch.prompts(200)
    answers = ray_data_batch.run_batch(model_path, rows, max_tokens=4, engines=2)
    ids = collections.Counter(a["id"] for a in answers)
    assert sorted(ids) == list(range(200)) and set(ids.values()) == {1}, "each prompt answered once"
    by_id = {r["id"]: r["prompt"] for r in rows}
    assert all(a["prompt"] == by_id[a["id"]] for a in answers), "each answer carries its own prompt"
    assert all(a["text"] and a["num_tokens"] > 0 for a in answers)
    nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert {a["node"] for a in answers} == nodes and len(nodes) == 2, "an engine on each node"
    assert len({(a["node"], a["pid"]) for a in answers}) == 2, "two engine actors"
