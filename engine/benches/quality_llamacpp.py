"""llama.cpp's distributions over the windows of one of our quality reference files.

    target/venv-llamacpp/bin/python engine/benches/quality_llamacpp.py \
        --model MODEL.gguf --reference OURS.ref [--out EVALUATED.bin] [--out-reference LLAMACPP.ref] \
        [--threads N] [--kv-f32 | --kv-q8] [--no-extra-buffers]

`OURS.ref` is a reference file of ours (`cargo xtask perplexity --save-logits`, format in
`model/src/quality/file.rs`). Each of its windows runs through llama.cpp (llama-cpp-python, the
build `cargo xtask llamacpp-python` makes in `target/venv-llamacpp`: pinned release, this
CPU's features, AMX off) as one sequence in a fresh KV cache, and every scored row of llama.cpp's goes
to one or both outputs:
- `--out`: an evaluated-rows file (`model/src/quality/evaluated.rs`): per row llama.cpp's
  log-probability of the text's next token, its most likely token and its log-probabilities of
  the reference row's top tokens; llama.cpp measured against our reference, as the `quality`
  bench and `cargo xtask perplexity --kl-reference OURS.ref --evaluated EVALUATED.bin` read it.
  This needs the reference's rows.
- `--out-reference`: a reference file of llama.cpp's own (the same header, tokens and windows as
  `OURS.ref`, the name saying which llama.cpp made it; rows of its top-k): our engine measured
  against llama.cpp with `cargo xtask perplexity --kl-reference LLAMACPP.ref`. This needs only
  the reference's header and tokens.

What runs is llama.cpp's default CPU path, as `llama-perplexity` would run it: its default KV
cache type (f16; `--kv-f32` keeps f32 instead, `--kv-q8` q8_0 keys and values as `-ctk q8_0
-ctv q8_0`), its default attention choice (`flash_attn`
auto, which turns flash attention on for the CPU; the `llama_cpp.Llama` wrapper would turn it
off), micro-batch and extra CPU buffer types (AMX, repacked weight layouts), sliding-window
layers keeping only their window (`swa_full` off, as in `peer_llamacpp.py`). With flash
attention on, this build's CPU kernel gives an f32 cache the same logits as an f16 one, so
`--kv-f32` changes what the cache stores, not how attention rounds. Those buffer types can crash on a VM that
advertises AMX (SIGSEGV in `ggml_backend_amx_mul_mat`), so, as the peer bench does, a child
process first decodes a few tokens with them; when it fails they are turned off and the output's
name says so. `--no-extra-buffers` turns them off without the probe (a caller that has probed).

The low-level API (as in `peer_llamacpp.py`) rather than `llama_cpp.Llama`: it exposes
`use_extra_bufts` and `swa_full`, and each row's logits are read where llama.cpp left them
instead of through the wrapper's n_ctx × n_vocab copy. Log-probabilities are the log-softmax of
the logits computed in float64 and stored as f32; the most likely token and top-k ties go to the
lower id, as in ours. Progress goes to stderr.
"""

import argparse
import ctypes
import os
import struct
import subprocess
import sys

import llama_cpp as L
import numpy as np

MAGIC = b"PLLMQREF"
EVALUATED_MAGIC = b"PLLMQEVL"
VERSION = 1
# ggml_type ids of the KV cache's element types.
GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q8_0 = 0, 1, 8
# Rows turned into log-probabilities at once.
ROW_CHUNK = 64


def fail(message):
    sys.exit(f"quality_llamacpp: {message}")


def read_reference(path):
    """The header (a dict, with `rows_at`: the rows' offset) and tokens (windows × ctx, uint32)
    of a reference file; its rows are not read, only its length checked against the header."""
    try:
        f = open(path, "rb")
    except OSError as e:
        fail(f"cannot open {path}: {e}")
    with f:
        head = f.read(8 + 4 * 8)
        if len(head) < 8 + 4 * 8:
            fail(f"{path}: {len(head)} bytes, shorter than a reference file's header")
        if head[:8] != MAGIC:
            fail(f"{path}: not a reference file (no {MAGIC.decode()} magic)")
        version, vocab, ctx, stride, windows, first_scored, top_k, name_len = struct.unpack("<8I", head[8:])
        if version != VERSION:
            fail(f"{path}: version {version} (this script reads {VERSION})")
        if name_len > 4096:
            fail(f"{path}: a model name of {name_len} bytes")
        name = f.read(name_len)
        if ctx < 4 or first_scored + 1 >= ctx or top_k == 0 or top_k > vocab or windows == 0:
            fail(f"{path}: inconsistent header (vocab {vocab}, ctx {ctx}, windows {windows}, "
                 f"first_scored {first_scored}, top_k {top_k})")
        raw = f.read(windows * ctx * 4)
        if len(raw) != windows * ctx * 4:
            fail(f"{path}: truncated in its tokens")
        f.seek(0, os.SEEK_END)
        rows = windows * (ctx - 1 - first_scored)
        want = 8 + 4 * 8 + name_len + windows * ctx * 4 + rows * (4 + 8 * top_k)
        if f.tell() != want:
            fail(f"{path}: {f.tell()} bytes, its header describes {want}")
    tokens = np.frombuffer(raw, dtype="<u4").reshape(windows, ctx)
    if int(tokens.max()) >= vocab:
        fail(f"{path}: token {int(tokens.max())} is outside its vocabulary of {vocab}")
    header = dict(vocab=vocab, ctx=ctx, stride=stride, windows=windows, first_scored=first_scored,
                  top_k=top_k, name=name.decode("utf-8", "replace"), rows_at=8 + 4 * 8 + name_len + windows * ctx * 4)
    return header, tokens


def quiet_llama_cpp():
    # llama.cpp logs every tensor it loads; the callback must outlive every call.
    global _silent
    _silent = L.llama_log_callback(lambda level, text, user: None)
    L.llama_log_set(_silent, ctypes.c_void_p())


def load(model_path, extra_bufts):
    L.llama_backend_init()
    mparams = L.llama_model_default_params()
    mparams.use_extra_bufts = extra_bufts
    model = L.llama_model_load_from_file(model_path.encode(), mparams)
    if not model:
        fail(f"llama.cpp cannot load {model_path}")
    return model


def new_context(model, n_ctx, threads, kv_type):
    p = L.llama_context_default_params()
    # One window per decode: n_batch = the window; n_ubatch stays llama.cpp's default.
    p.n_ctx, p.n_batch, p.n_seq_max = n_ctx, n_ctx, 1
    p.n_threads = p.n_threads_batch = threads
    p.type_k = p.type_v = kv_type
    p.swa_full = False
    ctx = L.llama_init_from_model(model, p)
    if not ctx:
        fail("cannot create a llama.cpp context")
    return ctx


def decode_all(ctx, tokens):
    """One llama_decode of `tokens` as sequence 0 from position 0, logits for every position."""
    batch = L.llama_batch_init(len(tokens), 0, 1)
    for i, t in enumerate(tokens):
        batch.token[i] = int(t)
        batch.pos[i] = i
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = 0
        batch.logits[i] = 1
    batch.n_tokens = len(tokens)
    rc = L.llama_decode(ctx, batch)
    L.llama_batch_free(batch)
    if rc != 0:
        fail(f"llama_decode returned {rc}")


def top_k_rows(logp, k):
    """Per row of `logp` (f32 log-probabilities), the k largest, most likely first, ties to the
    lower id: (ids, values)."""
    part = np.argpartition(-logp, k - 1, axis=1)[:, :k]
    vals = np.take_along_axis(logp, part, axis=1)
    # argpartition splits a tie at the k-th value arbitrarily: where the row holds more tokens
    # equal to its k-th largest than the partition kept, choose again from all of them so that
    # the lowest ids are kept.
    kth = vals.min(axis=1)
    split = (logp == kth[:, None]).sum(axis=1) > (vals == kth[:, None]).sum(axis=1)
    for r in np.flatnonzero(split):
        row = logp[r]
        cand = np.concatenate([part[r][vals[r] > kth[r]], np.flatnonzero(row == kth[r])[: k]])
        part[r] = cand[:k]
        vals[r] = row[part[r]]
    # Most likely first, then the lower id.
    order = np.lexsort((part, -vals), axis=1)
    return np.take_along_axis(part, order, axis=1).astype("<u4"), np.take_along_axis(vals, order, axis=1).astype("<f4")


def probe(args):
    """Loads the model with llama.cpp's extra buffer types and decodes a few tokens (the
    parent's check that they do not crash on this machine)."""
    quiet_llama_cpp()
    model = load(args.model, True)
    ctx = new_context(model, 64, args.threads, GGML_TYPE_F16)
    decode_all(ctx, list(range(10, 42)))
    print("probe ok")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="the GGUF llama.cpp runs")
    ap.add_argument("--reference", help="our reference file: its windows are what llama.cpp runs")
    ap.add_argument("--out", help="write an evaluated-rows file (llama.cpp's rows against the reference's)")
    ap.add_argument("--out-reference", help="write a reference file of llama.cpp's own rows")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    kv = ap.add_mutually_exclusive_group()
    kv.add_argument("--kv-f32", action="store_true", help="f32 KV cache (llama.cpp's default: f16)")
    kv.add_argument("--kv-q8", action="store_true", help="q8_0 K and V cache (needs flash attention, on)")
    ap.add_argument("--no-extra-buffers", action="store_true",
                    help="llama.cpp without its extra CPU buffer types (AMX, repacked layouts)")
    ap.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.probe:
        return probe(args)
    if not args.reference or not (args.out or args.out_reference):
        ap.error("--reference and at least one of --out, --out-reference are required")

    header, tokens = read_reference(args.reference)
    n_ctx, first, k, vocab = header["ctx"], header["first_scored"], header["top_k"], header["vocab"]
    per_window = n_ctx - 1 - first

    extra_bufts = not args.no_extra_buffers
    if extra_bufts:
        child = subprocess.run([sys.executable, os.path.abspath(__file__), "--model", args.model,
                                "--probe", "--threads", str(args.threads)], capture_output=True, text=True)
        if child.returncode != 0:
            print(f"quality_llamacpp: llama.cpp with its extra buffer types failed (exit {child.returncode}); "
                  "running without them", file=sys.stderr)
            extra_bufts = False

    quiet_llama_cpp()
    model = load(args.model, extra_bufts)
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    if n_vocab != vocab:
        fail(f"{args.model} has a vocabulary of {n_vocab} tokens, {args.reference} one of {vocab}: "
             "not the same model's tokens")
    kv_type = GGML_TYPE_F32 if args.kv_f32 else GGML_TYPE_Q8_0 if args.kv_q8 else GGML_TYPE_F16
    ctx = new_context(model, n_ctx, args.threads, kv_type)
    mem = L.llama_get_memory(ctx)

    name = f"llama.cpp (llama-cpp-python {L.__version__}) default CPU path, {os.path.basename(args.model)}"
    if args.kv_f32 or args.kv_q8:
        name += ", f32 KV cache" if args.kv_f32 else ", q8_0 KV cache"
    if not extra_bufts:
        name += ", no extra CPU buffer types"
    name_bytes = name.encode("utf-8")

    ref_rows = evaluated = own = None
    if args.out:
        ref_rows = open(args.reference, "rb")
        ref_rows.seek(header["rows_at"])
        evaluated = open(args.out, "wb")
        evaluated.write(EVALUATED_MAGIC)
        evaluated.write(struct.pack("<7I", VERSION, vocab, n_ctx, header["windows"], first, k, len(name_bytes)))
        evaluated.write(name_bytes)
    if args.out_reference:
        own = open(args.out_reference, "wb")
        own.write(MAGIC)
        own.write(struct.pack("<8I", VERSION, vocab, n_ctx, header["stride"], header["windows"], first, k,
                              len(name_bytes)))
        own.write(name_bytes)
        own.write(tokens.astype("<u4").tobytes())

    nexts = []
    for w, window in enumerate(tokens):
        # A fresh cache per window: every window is its own sequence from position 0.
        L.llama_memory_clear(mem, True)
        decode_all(ctx, window)
        if ref_rows:
            raw = ref_rows.read(per_window * (4 + 8 * k))
            # The reference row's top tokens (its `next` and log-probabilities are not needed).
            ref_tops = np.frombuffer(raw, dtype="<u4").reshape(per_window, 1 + 2 * k)[:, 1::2].astype(np.int64)
            if int(ref_tops.max()) >= vocab:
                fail(f"{args.reference}: a row's token is outside its vocabulary")
        # Rows in chunks: a whole window of float64 rows of a large vocabulary is gigabytes.
        for lo in range(first, n_ctx - 1, ROW_CHUNK):
            rows = range(lo, min(lo + ROW_CHUNK, n_ctx - 1))
            logits = np.empty((len(rows), n_vocab), dtype=np.float64)
            for r, j in enumerate(rows):
                logits[r] = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, j), shape=(n_vocab,))
            # log_softmax in float64, stored as f32.
            m = logits.max(axis=1, keepdims=True)
            lse = m + np.log(np.exp(logits - m).sum(axis=1, keepdims=True))
            logp = (logits - lse).astype(np.float32)
            at = np.arange(len(rows))
            nxt = logp[at, window[rows.start + 1:rows.stop + 1].astype(np.int64)]
            if evaluated:
                # np.argmax keeps the first of equal maxima: the lower id, as ours.
                top = np.argmax(logp, axis=1).astype("<u4")
                tops = ref_tops[rows.start - first:rows.stop - first]
                body = np.empty((len(rows), 2 + k), dtype="<u4")
                body[:, 0] = nxt.view("<u4")
                body[:, 1] = top
                body[:, 2:] = logp[at[:, None], tops].view("<u4")
                evaluated.write(body.tobytes())
            if own:
                ids, vals = top_k_rows(logp, k)
                body = np.empty((len(rows), 1 + 2 * k), dtype="<u4")
                body[:, 0] = nxt.view("<u4")
                body[:, 1::2] = ids
                body[:, 2::2] = vals.view("<u4")
                own.write(body.tobytes())
            nexts.append(nxt.astype(np.float64))
        done = np.concatenate(nexts)
        print(f"quality_llamacpp: window {w + 1}/{header['windows']}, perplexity so far "
              f"{np.exp(-done.mean()):.4f}", file=sys.stderr, flush=True)
    for f in (ref_rows, evaluated, own):
        if f:
            f.close()
    L.llama_free(ctx)
    L.llama_model_free(model)
    wrote = " and ".join(p for p in (args.out, args.out_reference) if p)
    print(f"quality_llamacpp: wrote {wrote} ({name})", file=sys.stderr)


if __name__ == "__main__":
    main()
