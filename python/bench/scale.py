"""The ``scale`` bench group (``cargo xtask bench --only scale``): the engine on Ray Serve
against itself in process, one replica against two, and four routing policies on a
multi-turn workload at three KV cache sizes, on 2 and on 4 replicas, on a local single-node Ray cluster; writes the
figures as a flat JSON map (and a markdown fragment) into ``$BENCH_FIGURES_DIR``.

- ``scale.serve_over_inprocess``: output tokens/s of one Serve replica (through the HTTP
  proxy, the ingress and the replica) over the same requests on an in-process ``AsyncLLM``.
- ``scale.serve_2rep_over_1rep``: output tokens/s of two replicas over one, on this machine
  (with few cores it measures the overhead of a second engine, not scaling).

The prefix workload: 4 users per replica, 2 per replica conversing at a time, each sending 3
turns one after another behind a long system prompt of its own (some 200 tokens), to 2 replicas
and then to 4, with prefix caching, each deployment given 3 rounds of new users (1 with
``BENCH_QUICK=1``, and 1 at 4 replicas: eight engines share two cores). ``<policy>`` is the
routing: ``rr`` (round robin), ``p2c`` (Serve's power of two choices), ``prefix`` (the
approximate prefix-aware router, which guesses from routing history) or ``events`` (the router
that follows each replica's KV cache events). ``<size>`` is each replica's KV cache, computed
from the token counts that an in-process run of one conversation measures, so that the replicas
together hold the whole conversations (last prompt and reply) of a ``quarter``, ``half`` or
``all`` of the users (``_calibrate``, ``Sizing.user_blocks``, ``_kv_blocks``). Figures of the
4-replica deployments carry the suffix ``_4rep``:

- ``scale.prefix_hit_rate_<policy>_<size>``: prompt tokens served from the prefix cache over
  all prompt tokens (``usage.prompt_tokens_details.cached_tokens / prompt_tokens``, summed
  over the round's requests, first turns included); median of rounds.
- ``scale.prefix_hit_gain_over_rr_<size>``: the prefix policy's hit rate less round robin's
  (a difference, not a ratio: round robin's can be 0).
- ``scale.events_hit_over_approx_<size>``: the events policy's hit rate over the prefix
  policy's (left out with a note, never ``inf``, if the latter is 0).
- ``scale.prefix_ttft_p50_ms_<policy>_<size>``, ``scale.prefix_ttft_p90_ms_<policy>_<size>``:
  milliseconds from sending a streamed turn to its first content chunk, over every round's
  turns after the first (a first turn's prompt is in no cache, whatever the routing).
- ``scale.prefix_ttft_p50_over_rr_<size>``, ``scale.events_ttft_p50_over_rr_<size>``: the
  prefix (events) policy's TTFT p50 over round robin's (below 1: it answers sooner).
- ``scale.prefix_out_tok_s_<policy>_<size>``: output tokens of a round over its wall time;
  median of rounds.

Throughput requests are not streamed: a stream's events cross three Python processes each,
which is the proxy's cost per token, not the deployment's. The prefix workload's are, for
their TTFT, alike for every policy. Ray's workers run at the driver's priority here
(``RAY_worker_niceness=0``). Medians of an odd number of rounds.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import socket
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

# The cluster stays on loopback (see python/examples/ray_data_batch.py): set before Ray loads.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# No usage reports: nothing here reaches past the machine.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Ray runs its workers (the replicas, the proxy) at niceness 15 by default: on a machine with
# other work that measures their priority, not the deployment. Same priority as in process.
os.environ.setdefault("RAY_worker_niceness", "0")

import paged_llm  # noqa: E402
from paged_llm.serve import REPLICA_HEADER, build_app  # noqa: E402

QUICK = os.environ.get("BENCH_QUICK") == "1"
ROUNDS = 1 if QUICK else 3
#: Throughput workload: this many concurrent requests of this many output tokens each.
TPUT_REQUESTS = 32
TPUT_TOKENS = 64
TPUT_ENGINE = {"max_num_seqs": 32, "num_kv_blocks": 512, "max_model_len": 1024}

#: Prefix workload: rounds on each deployment, each with users of its own (so that what an
#: earlier round left in the cache matches nothing, and is what LRU evicts first), by the
#: deployment's number of replicas.
PREFIX_ROUNDS = {2: 1 if QUICK else 3, 4: 1}
# Small, for the group to take some half an hour on 2 idle cores: 12 deployments of 2 replicas
# with 3 rounds, 12 of 4 with one; a round whose turns all miss the cache prefills some 7k
# tokens per 8 users.
USERS_PER_REPLICA, TURNS, REPLY_TOKENS = 4, 3, 16
#: Users converse this many at a time per replica, the next starting when one finishes (a
#: closed loop, the same on a fast or a slow machine): what a replica's cache holds between one
#: user's turns then depends on how many of the others its routing sends it. All at once, every
#: size but the largest thrashes alike under LRU; one at a time, the smallest holds everything.
CONCURRENT_PER_REPLICA = 2
SYSTEM_WORDS = 200
#: The deployments' sizes, and the figure-name suffix of each.
REPLICA_COUNTS = {2: "", 4: "_4rep"}
#: Figure-name suffix -> ``build_app``'s ``routing``.
POLICIES = {"rr": "round_robin", "p2c": "power_of_two", "prefix": "prefix", "events": "events"}
#: Figure-name suffix -> the share of the users whose whole conversation the replicas' KV
#: caches hold together.
CACHE_SIZES = {"quarter": 0.25, "half": 0.5, "all": 1.0}
BLOCK_SIZE = 16
#: ``EngineConfig``'s default watermark (not an engine argument): admission keeps
#: ``int(ENGINE_WATERMARK * num_kv_blocks)`` blocks free.
ENGINE_WATERMARK = 0.01
#: Each replica's engine but for ``num_kv_blocks``, which ``_kv_blocks`` sets per size.
PREFIX_ENGINE = {"max_num_seqs": 16, "max_model_len": 2048, "enable_prefix_caching": True, "block_size": BLOCK_SIZE}

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


def _user_turn(turn: int) -> str:
    return f"Turn {turn}: which word comes after number {turn}?"


def _round_users(round_: int, users: int) -> List[int]:
    return list(range(round_ * users, (round_ + 1) * users))


@dataclass
class Sizing:
    """What the KV cache sizes are computed from (tokens)."""

    #: Each user's first-turn prompt: its system prompt in the chat template.
    first_prompt: Dict[int, int]
    #: What a conversation adds to its first prompt by the end of its last reply.
    tail: int

    def user_blocks(self) -> int:
        """KV blocks of the longest user's whole conversation (last prompt and reply), plus
        one: a reply the replicas generate can re-tokenize a few tokens longer than the
        calibration's, and a conversation that outgrew a one-user cache would not run."""
        return math.ceil((max(self.first_prompt.values()) + self.tail) / BLOCK_SIZE) + 1


def _calibrate(model: str, users: Sequence[int]) -> Sizing:
    """Runs the first user's conversation in process, as the replicas will (greedy, the same
    replies' lengths), for the tokens its turns add to the system prompt; every user's
    first prompt is that one's, shifted by how much longer its system prompt tokenizes (the
    chat template around it is the same)."""
    params = paged_llm.SamplingParams(temperature=0.0, max_tokens=REPLY_TOKENS, ignore_eos=True)
    # Room for one conversation at the longest the replicas accept.
    blocks = PREFIX_ENGINE["max_model_len"] // BLOCK_SIZE + 1
    with paged_llm.LLM(model, **PREFIX_ENGINE, num_kv_blocks=blocks) as llm:
        messages = [{"role": "system", "content": _system_prompt(users[0])}]
        prompts: List[int] = []
        for turn in range(TURNS):
            messages.append({"role": "user", "content": _user_turn(turn)})
            out = llm.chat(messages, params)[0]
            prompts.append(len(out.prompt_token_ids))
            messages.append({"role": "assistant", "content": out.outputs[0].text})
        system = {u: len(llm.tokenize(_system_prompt(u))) for u in users}
    first = {u: prompts[0] + system[u] - system[users[0]] for u in users}
    return Sizing(first_prompt=first, tail=prompts[-1] + REPLY_TOKENS - prompts[0])


def _kv_blocks(share: float, user_blocks: int) -> int:
    """Each replica's ``num_kv_blocks`` for the replicas to hold ``share`` of the users'
    whole conversations together: ``share * USERS_PER_REPLICA`` conversations of
    ``user_blocks`` each (the longest user's), and the watermark on top."""
    held = share * USERS_PER_REPLICA
    if held != int(held) or held < 1:
        raise ValueError(f"{share} of {USERS_PER_REPLICA} users is not a whole number per replica")
    need = int(held) * user_blocks
    blocks = need
    # Admission keeps int(watermark * blocks) free: the smallest pool whose rest holds `need`.
    while blocks - int(ENGINE_WATERMARK * blocks) < need:
        blocks += 1
    return blocks


@dataclass
class Round:
    """One round of the prefix workload on one deployment."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    #: The most ``cached_tokens`` could be: each turn after the first finding its user's
    #: previous turn (prompt and reply, in whole blocks) in the cache, and nothing else.
    reachable_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    #: Seconds to the first content chunk, of first turns and of the others.
    ttft_first: List[float] = field(default_factory=list)
    ttft_later: List[float] = field(default_factory=list)
    #: Replica id -> how many users' first turns it answered; how many later turns a replica
    #: other than the previous turn's answered (what the hit rates follow from).
    first_turns: Dict[str, int] = field(default_factory=dict)
    moved: int = 0

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens

    @property
    def reachable(self) -> float:
        return self.reachable_tokens / self.prompt_tokens

    @property
    def out_tok_s(self) -> float:
        return self.completion_tokens / self.seconds


async def _conversations(client: Any, users: Sequence[int], replicas: int) -> Round:
    """The users, ``CONCURRENT_PER_REPLICA`` per replica at a time in order, each sending its
    turns one after another, streamed."""
    result = Round()
    slots = asyncio.Semaphore(CONCURRENT_PER_REPLICA * replicas)

    async def user(u: int) -> None:
        async with slots:
            await conversation(u)

    async def conversation(u: int) -> None:
        messages = [{"role": "system", "content": _system_prompt(u)}]
        # KV the previous turn computed: its prompt and reply but the reply's last token.
        computed = 0
        replica = None
        for turn in range(TURNS):
            messages.append({"role": "user", "content": _user_turn(turn)})
            start = time.monotonic()
            raw = await client.chat.completions.with_raw_response.create(
                model=client.served_model,
                messages=messages,
                max_tokens=REPLY_TOKENS,
                temperature=0.0,
                stream=True,
                stream_options={"include_usage": True},
                # Replies of one length whatever the routing: the KV sizes count on it.
                extra_body={"ignore_eos": True},
            )
            previous, replica = replica, raw.headers.get(REPLICA_HEADER, "")
            if turn == 0:
                result.first_turns[replica] = result.first_turns.get(replica, 0) + 1
            elif replica != previous:
                result.moved += 1
            stream = raw.parse()
            first, parts, usage = None, [], None
            async for chunk in stream:
                if chunk.usage is not None:
                    usage = chunk.usage
                for choice in chunk.choices:
                    if choice.delta.content:
                        if first is None:
                            first = time.monotonic() - start
                        parts.append(choice.delta.content)
            if first is None or usage is None:
                raise RuntimeError(f"user {u} turn {turn}: a stream without content or usage")
            (result.ttft_first if turn == 0 else result.ttft_later).append(first)
            result.prompt_tokens += usage.prompt_tokens
            result.completion_tokens += usage.completion_tokens
            # Whole blocks only, and a prompt's last token is always computed.
            result.reachable_tokens += min(computed // BLOCK_SIZE * BLOCK_SIZE, usage.prompt_tokens - 1)
            computed = usage.prompt_tokens + usage.completion_tokens - 1
            details = usage.prompt_tokens_details
            result.cached_tokens += (details.cached_tokens or 0) if details is not None else 0
            messages.append({"role": "assistant", "content": "".join(parts)})

    start = time.monotonic()
    await asyncio.gather(*(user(u) for u in users))
    result.seconds = time.monotonic() - start
    return result


async def _warm_up(client: Any, replicas: int) -> None:
    """As many short requests as replicas (a replica's first steps pay one-time costs)."""

    async def one(i: int) -> None:
        await client.chat.completions.create(
            model=client.served_model, messages=[{"role": "user", "content": f"Hello {i}"}], max_tokens=2
        )

    await asyncio.gather(*(one(i) for i in range(replicas)))


def _quantile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _spread(values: Sequence[float], fmt: str = ".3f") -> str:
    """Median, mean and p90 of rounds, for the notes."""
    med, mean, p90 = statistics.median(values), statistics.fmean(values), _quantile(values, 0.9)
    return f"{med:{fmt}} (mean {mean:{fmt}}, p90 {p90:{fmt}})"


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


def _prefix_workload(
    model: str, base: str, run: Any, replicas: int, figures: Dict[str, float], notes: List[str]
) -> None:
    """Sizes the caches, runs every policy at every size on ``replicas`` replicas, and sets the
    ``scale.prefix_*`` and ``scale.events_*`` figures (suffixed per ``REPLICA_COUNTS``)."""
    rounds, users, suffix = PREFIX_ROUNDS[replicas], USERS_PER_REPLICA * replicas, REPLICA_COUNTS[replicas]
    all_users = [u for r in range(rounds) for u in _round_users(r, users)]
    sizing = _calibrate(model, all_users)
    user_blocks = sizing.user_blocks()
    kv_blocks = {size: _kv_blocks(share, user_blocks) for size, share in CACHE_SIZES.items()}
    lo, hi = min(sizing.first_prompt.values()), max(sizing.first_prompt.values())
    notes.append(
        f"prefix workload: {users} users x {TURNS} turns of {REPLY_TOKENS} reply tokens, {rounds} "
        f"round(s) of new users per deployment of {replicas} replicas; first prompts of "
        f"{lo if lo == hi else f'{lo}-{hi}'} tokens, conversations {sizing.tail} tokens longer by their last "
        f"reply: {user_blocks} blocks of {BLOCK_SIZE} for the longest; num_kv_blocks per replica: "
        + ", ".join(f"{size} {kv_blocks[size]}" for size in CACHE_SIZES)
    )

    results: Dict[Tuple[str, str], List[Round]] = {}
    for i, size in enumerate(CACHE_SIZES):
        # The policies' order turns with each size, so that a drift in the machine's load
        # does not always fall on the same one.
        names = list(POLICIES)
        names = names[i % len(names) :] + names[: i % len(names)]
        for policy in names:
            engine = dict(PREFIX_ENGINE, num_kv_blocks=kv_blocks[size])
            _deploy(model, engine_args=engine, num_replicas=replicas, routing=POLICIES[policy])
            try:
                client = _client(base)
                run(_warm_up(client, replicas))
                results[policy, size] = [
                    run(_conversations(client, _round_users(r, users), replicas)) for r in range(rounds)
                ]
                run(client.close())
            finally:
                _undeploy()

    for size in CACHE_SIZES:
        lines = [_prefix_figures(policy, size, suffix, results[policy, size], figures) for policy in POLICIES]

        def fig(name: str) -> float:
            return figures[f"scale.{name}_{size}{suffix}"]

        figures[f"scale.prefix_hit_gain_over_rr_{size}{suffix}"] = fig("prefix_hit_rate_prefix") - fig(
            "prefix_hit_rate_rr"
        )
        rr_ttft = fig("prefix_ttft_p50_ms_rr")
        for policy in ("prefix", "events"):
            figures[f"scale.{policy}_ttft_p50_over_rr_{size}{suffix}"] = fig(f"prefix_ttft_p50_ms_{policy}") / rr_ttft
        approx = fig("prefix_hit_rate_prefix")
        # Never `inf`: with no hit at all under the approximate router the ratio has no value.
        ratio = fig("prefix_hit_rate_events") / approx if approx > 0 else None
        if ratio is not None:
            figures[f"scale.events_hit_over_approx_{size}{suffix}"] = ratio
        notes.append(
            f"{replicas} replicas, KV caches for the conversations of {CACHE_SIZES[size]:g} of the users ({size}, "
            f"{kv_blocks[size]} blocks per replica); hit rates and tok/s: medians of rounds; TTFT: over every "
            "round's turns\n"
            + "\n".join(lines)
            + ("" if ratio is not None else "\n  - events over approximate hit rate: no value, the approximate hit nothing")
        )


def _prefix_figures(
    policy: str, size: str, suffix: str, rounds: List[Round], figures: Dict[str, float]
) -> str:
    """Sets one policy's figures at one size; returns its line of the notes."""
    later = [t for r in rounds for t in r.ttft_later]
    first = statistics.median(t for r in rounds for t in r.ttft_first) * 1e3
    name = f"{policy}_{size}{suffix}"
    figures[f"scale.prefix_hit_rate_{name}"] = statistics.median(r.hit_rate for r in rounds)
    figures[f"scale.prefix_ttft_p50_ms_{name}"] = p50 = statistics.median(later) * 1e3
    figures[f"scale.prefix_ttft_p90_ms_{name}"] = p90 = _quantile(later, 0.9) * 1e3
    figures[f"scale.prefix_out_tok_s_{name}"] = statistics.median(r.out_tok_s for r in rounds)
    reachable = statistics.median(r.reachable for r in rounds)
    splits = ", ".join("/".join(str(n) for n in sorted(r.first_turns.values(), reverse=True)) for r in rounds)
    moved = sum(r.moved for r in rounds)
    return (
        f"  - {policy}: hit rate {_spread([r.hit_rate for r in rounds])} of a reachable {reachable:.3f}; "
        f"TTFT after the first turn p50 {p50:.0f} ms, p90 {p90:.0f} ms (first turns p50 {first:.0f} ms); "
        f"output tok/s {_spread([r.out_tok_s for r in rounds], '.1f')}; users per replica at their first "
        f"turn {splits}; {moved} of {len(later)} later turns answered by another replica than the turn before"
    )


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

        for replicas in REPLICA_COUNTS:
            _prefix_workload(model, base, run, replicas, figures, notes)
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
