"""llama.cpp's side of the `peer` bench group (run by `engine/benches/peer.rs`).

`python peer_llamacpp.py MODEL.gguf WORKLOAD.json THREADS` measures, on the same token ids as
our engine, with llama-cpp-python's low-level API (llama.cpp's own batched decoding):
- `prefill_512`: one prompt of 512 tokens in one batch (tokens / s);
- `prefill_6000`: one prompt of 6 000 tokens in batches of 2 048 (tokens / s);
- `decode_6000`: greedy decode of 128 tokens after that prompt, in the same run (tokens / s after
  the first);
- `decode_b1`: greedy decode of 128 tokens after a ~40-token prompt (tokens / s after the first);
- `e2e_16`, `e2e_64`: 16 or 64 requests of ~40 prompt tokens and 128 greedy output tokens, all
  at once, one sequence per request in one batch (output tokens / s, prefill included).
The workload's `cases` says which run, and its `max_tokens` how many tokens the decode and e2e
cases generate. Each case runs `reps` times; prints one JSON object with the median tok/s per case. Contexts keep
llama.cpp's sliding-window KV cache for windowed layers (`swa_full` off, as `llama-cli` runs by
default; the C API's default keeps the full cache).

`python peer_llamacpp.py MODEL.gguf --probe THREADS` only loads the model and decodes a few
tokens: the bench runs it first, because llama.cpp's extra CPU buffer types (AMX, repacked
layouts) can crash on a machine that advertises AMX (a VM: SIGSEGV in
`ggml_backend_amx_mul_mat`); with `PEER_NO_EXTRA_BUFTS=1` they are off. With
`PEER_KV_TYPE=q8_0` the contexts keep q8_0 keys and values (`-ctk q8_0 -ctv q8_0`; flash
attention, which a quantized V cache needs, is on by default on the CPU).
"""

import ctypes
import json
import os
import statistics
import sys
import time

import llama_cpp as L
import numpy as np

PROBE = sys.argv[2] == "--probe"
MODEL, THREADS = sys.argv[1], int(sys.argv[3])
WORKLOAD = None if PROBE else json.load(open(sys.argv[2]))
EXTRA_BUFTS = os.environ.get("PEER_NO_EXTRA_BUFTS") != "1"
# ggml_type ids of the KV cache types the bench asks for.
KV_TYPES = {"f16": 1, "q8_0": 8}
KV_TYPE = KV_TYPES[os.environ.get("PEER_KV_TYPE", "f16")]

# Quiet: llama.cpp logs every tensor it loads.
_silent = L.llama_log_callback(lambda level, text, user: None)
L.llama_log_set(_silent, ctypes.c_void_p())
L.llama_backend_init()
mparams = L.llama_model_default_params()
mparams.use_extra_bufts = EXTRA_BUFTS
model = L.llama_model_load_from_file(MODEL.encode(), mparams)
assert model, f"cannot load {MODEL}"
vocab = L.llama_model_get_vocab(model)
n_vocab = L.llama_vocab_n_tokens(vocab)


def new_context(n_ctx, n_seq, n_batch):
    p = L.llama_context_default_params()
    p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = n_ctx, n_batch, n_batch, n_seq
    p.n_threads = p.n_threads_batch = THREADS
    p.swa_full = False
    p.type_k = p.type_v = KV_TYPE
    ctx = L.llama_init_from_model(model, p)
    assert ctx, "cannot create a llama.cpp context"
    return ctx


def decode(ctx, entries):
    """One llama_decode of (token, position, seq, wants_logits) entries; returns the batch rows
    that have logits, in order."""
    batch = L.llama_batch_init(len(entries), 0, 1)
    rows = []
    for i, (tok, pos, seq, logits) in enumerate(entries):
        batch.token[i] = tok
        batch.pos[i] = pos
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq
        batch.logits[i] = 1 if logits else 0
        if logits:
            rows.append(i)
    batch.n_tokens = len(entries)
    rc = L.llama_decode(ctx, batch)
    L.llama_batch_free(batch)
    assert rc == 0, f"llama_decode returned {rc}"
    return rows


def argmax(ctx, row):
    ptr = L.llama_get_logits_ith(ctx, row)
    return int(np.argmax(np.ctypeslib.as_array(ptr, shape=(n_vocab,))))


def run_requests(prompts, max_tokens, n_batch):
    """Every prompt as its own sequence: prefill in batches of ≤ n_batch tokens, then one
    decode step per output token for all live sequences. Returns (wall s, per-request
    (ttft s, end s), output tokens)."""
    n_ctx = sum(len(p) + max_tokens for p in prompts) + 64
    ctx = new_context(n_ctx, len(prompts), n_batch)
    start = time.perf_counter()
    pending = [(tok, pos, s, pos == len(p) - 1) for s, p in enumerate(prompts) for pos, tok in enumerate(p)]
    nexts, first = {}, {}
    while pending:
        chunk, pending = pending[:n_batch], pending[n_batch:]
        rows = decode(ctx, chunk)
        ends = [e for e in chunk if e[3]]
        for (_, _, s, _), row in zip(ends, rows):
            nexts[s] = argmax(ctx, row)
            first[s] = time.perf_counter() - start
    produced = {s: 1 for s in nexts}
    end = {}
    for s in [s for s in nexts if max_tokens == 1]:
        end[s] = first[s]
        del nexts[s]
    while nexts:
        live = sorted(nexts)
        entries = [(nexts[s], len(prompts[s]) + produced[s] - 1, s, True) for s in live]
        rows = decode(ctx, entries)
        for s, row in zip(live, rows):
            produced[s] += 1
            if produced[s] == max_tokens:
                end[s] = time.perf_counter() - start
                del nexts[s]
            else:
                nexts[s] = argmax(ctx, row)
    wall = time.perf_counter() - start
    L.llama_free(ctx)
    return wall, [(first[s], end[s]) for s in range(len(prompts))], sum(produced.values())


def median_of(reps, f):
    return statistics.median(f() for _ in range(reps))


if PROBE:
    run_requests([list(range(10, 42))], 4, 512)
    print(json.dumps({"probe": "ok"}))
    sys.exit(0)

reps = WORKLOAD["reps"]
cases = set(WORKLOAD["cases"])
out = {}
p512 = WORKLOAD["prefill_512"]
run_requests([p512[:8]], 2, 512)  # warm-up
if "prefill_512" in cases:
    out["prefill_512_tok_s"] = median_of(reps, lambda: len(p512) / run_requests([p512], 1, 512)[1][0][0])
long = WORKLOAD["long_6000"]
p6000, after = long["prompt"], long["max_tokens"]
def long_rates():
    _, [(ttft, end)], n = run_requests([p6000], after, 2048)
    return len(p6000) / ttft, (n - 1) / (end - ttft)
if cases & {"prefill_6000", "decode_6000"}:
    rates = [long_rates() for _ in range(reps)]
    out["prefill_6000_tok_s"] = statistics.median(r[0] for r in rates)
    out["decode_6000_tok_s"] = statistics.median(r[1] for r in rates)
b1 = WORKLOAD["decode_b1"]
def decode_rate():
    _, [(ttft, end)], n = run_requests([b1["prompt"]], b1["max_tokens"], 512)
    return (n - 1) / (end - ttft)
if "decode_b1" in cases:
    out["decode_b1_tok_s"] = median_of(reps, decode_rate)
e2e = WORKLOAD["e2e_64"]
def e2e_rate(n_requests):
    wall, _, n = run_requests(e2e["prompts"][:n_requests], e2e["max_tokens"], 2048)
    return n / wall
for case, n_requests in (("e2e_16", 16), ("e2e_64", 64)):
    if case in cases:
        out[f"{case}_tok_s"] = median_of(reps, lambda: e2e_rate(n_requests))
out["llama_cpp_python"] = L.__version__
out["extra_bufts"] = EXTRA_BUFTS
out["kv_type"] = os.environ.get("PEER_KV_TYPE", "f16")
print(json.dumps(out))
