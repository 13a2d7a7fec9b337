"""Offline batch inference on Ray Data: one ``paged_llm.LLM`` per actor, ``map_batches`` over a
dataset of prompts, on a local two-node Ray cluster (a head and one worker node, each its own
raylet with its own resources, on loopback).

Run it from the repository root with the package and ``ray[data]`` installed (``cargo xtask
pytest`` makes such a venv, ``target/venv-python``)::

    target/venv-python/bin/python python/examples/ray_data_batch.py --model smollm2

``--address`` joins a running cluster instead of starting the local one.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from typing import Any, Dict, List, Optional

# Ray turns a loopback address given to `ray.init` into the machine's outward IP (and binds a
# local node there) unless told the cluster is local only: set before Ray is first imported.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# No usage reports: nothing here reaches past the machine.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

#: Each node offers one of these; an engine actor asks for one, so that the two actors of a
#: two-node cluster land one on each node (Ray Data's actor pool alone may pack them on one).
ENGINE_SLOT = "paged_llm_engine"

#: Small engines: two of them share this machine with the cluster's own processes.
ENGINE_ARGS: Dict[str, Any] = {"max_num_seqs": 32, "num_kv_blocks": 256, "max_model_len": 512}


class Generator:
    """The ``map_batches`` callable: loads one engine when Ray Data starts the actor and runs
    each batch of prompts through it as one offline batch (the prompts share its steps), each
    as a user's message in the model's chat template (an instruct model's form)."""

    def __init__(self, model: str, max_tokens: int, engine_args: Dict[str, Any]) -> None:
        import ray

        import paged_llm

        self.llm = paged_llm.LLM(model, **engine_args)
        self.params = paged_llm.SamplingParams(temperature=0.0, max_tokens=max_tokens)
        self.node = ray.get_runtime_context().get_node_id()
        self.pid = os.getpid()

    def __call__(self, batch: Dict[str, Any]) -> Dict[str, List[Any]]:
        conversations = [[{"role": "user", "content": str(p)}] for p in batch["prompt"]]
        outputs = self.llm.chat(conversations, self.params)
        return {
            "id": [int(i) for i in batch["id"]],
            "prompt": [str(p) for p in batch["prompt"]],
            "text": [o.outputs[0].text for o in outputs],
            "num_tokens": [len(o.outputs[0].token_ids) for o in outputs],
            "node": [self.node] * len(outputs),
            "pid": [self.pid] * len(outputs),
        }


def start_local_cluster(object_store_bytes: int = 100 * 1024 * 1024):
    """A head and one worker node on loopback, one CPU and one engine slot each; returns the
    ``ray.cluster_utils.Cluster`` (``shutdown()`` stops both nodes)."""
    from ray.cluster_utils import Cluster

    node_args = {
        "num_cpus": 1,
        "resources": {ENGINE_SLOT: 1},
        "object_store_memory": object_store_bytes,
    }
    cluster = Cluster(
        initialize_head=True,
        head_node_args={**node_args, "include_dashboard": False, "node_ip_address": "127.0.0.1"},
    )
    cluster.add_node(**node_args, node_ip_address="127.0.0.1")
    cluster.wait_for_nodes()
    return cluster


def prompts(n: int) -> List[Dict[str, Any]]:
    """``n`` distinct prompts with their ids."""
    topics = ["rivers", "mountains", "the moon", "bread", "trains", "owls", "glass", "rain"]
    return [{"id": i, "prompt": f"Question {i}: write one sentence about {topics[i % len(topics)]}."} for i in range(n)]


def run_batch(
    model: str,
    rows: List[Dict[str, Any]],
    max_tokens: int,
    engines: int = 2,
    batch_size: int = 25,
    engine_args: Optional[Dict[str, Any]] = None,
) -> List[Dict[str, Any]]:
    """Runs ``rows`` (``id``, ``prompt``) through ``engines`` actors, each holding one engine on
    a node of its own; returns one row per answer (``id``, ``text``, ``node``, …). Needs
    ``ray.init`` first."""
    import ray

    ds = ray.data.from_items(rows, override_num_blocks=max(1, len(rows) // batch_size))
    ds = ds.map_batches(
        Generator,
        fn_constructor_kwargs={
            "model": model,
            "max_tokens": max_tokens,
            "engine_args": dict(ENGINE_ARGS if engine_args is None else engine_args),
        },
        batch_size=batch_size,
        concurrency=engines,
        # The engine runs on threads of its own; the slot, not a CPU, is what an actor holds.
        num_cpus=0,
        resources={ENGINE_SLOT: 1},
    )
    return ds.take_all()


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="GGUF file, model folder or known name")
    parser.add_argument("--prompts", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--address", help="a running cluster's address (default: start a local one)")
    args = parser.parse_args(argv)

    import ray

    from paged_llm.models import resolve_model

    # The actors load the file themselves: give them a path, not a name to look up.
    model = os.path.abspath(resolve_model(args.model))
    cluster = None
    if args.address is None:
        cluster = start_local_cluster()
        ray.init(address=cluster.address, log_to_driver=False)
    else:
        ray.init(address=args.address)
    try:
        start = time.monotonic()
        answers = run_batch(model, prompts(args.prompts), args.max_tokens)
        elapsed = time.monotonic() - start
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
    ids = sorted(a["id"] for a in answers)
    per_node = collections.Counter(a["node"][:8] for a in answers)
    print(f"{len(answers)} answers for {args.prompts} prompts in {elapsed:.1f} s; per node: {dict(per_node)}")
    for a in sorted(answers, key=lambda a: a["id"])[:3]:
        print(f"  {a['id']}: {a['prompt']!r} -> {a['text']!r}")
    return 0 if ids == list(range(args.prompts)) else 1


if __name__ == "__main__":
    sys.exit(main())
