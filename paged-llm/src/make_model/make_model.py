"""A GGUF with random weights at a real model's shapes (`paged-llm make-model`).

    python make_model.py --spec SPEC.json --tokenizer SMOLLM2.gguf --out OUT.gguf [--threads N]

`SPEC.json` (written by `paged-llm/src/make_model.rs`): architecture, dimensions, vocabulary size,
whether the LM head is tied, the llama.cpp file type to quantize to, the seed. The file is made
the way users get theirs: an F16 GGUF written with llama.cpp's own writer (the `gguf` package),
then `llama_model_quantize` (llama.cpp's quantizer, from the llama-cpp-python build the `peer`
bench runs) to the asked type, with llama.cpp's own mix of tensor types (Q4_K_M: Q6_K for half
of `attn_v` / `ffn_down` and for the LM head; Q4_0: a Q6_K LM head). Then llama.cpp loads the
result and decodes a few tokens, so that a file this writes is one llama.cpp runs.

Weights: every matrix N(0, 1/fan_in) (its input width), biases N(0, 1/fan_in) too, norms 1; each
tensor drawn from its own generator seeded by (seed, tensor index), so a shape, type and seed
always give the same file. Tokenizer: the default model's (SmolLM2's byte-level BPE, read from
its GGUF) padded with `[PAD<i>]` tokens of type UNUSED up to the real vocabulary size, as
llama.cpp's converter pads a vocabulary, so that the embedding and the LM head cost what they
cost in the real model. Tensors are written one at a time (an 8B model's F16 is 16 GB).
"""

import argparse
import ctypes
import json
import os
import sys

import gguf
import llama_cpp as L
import numpy as np

# Tokenizer keys copied from the tokenizer's GGUF as they are.
TOKENIZER_KEYS = (
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_space_prefix",
    "tokenizer.chat_template",
)


def fail(message):
    sys.exit(f"make_model: {message}")


def tensors(spec):
    """(name, numpy shape [out, in] or [n], kind) of every tensor, in file order; kind is
    'matrix', 'bias' or 'norm'."""
    h, f, v = spec["hidden"], spec["ffn"], spec["vocab"]
    hd, nh, nkv = spec["head_dim"], spec["heads"], spec["kv_heads"]
    out = [("token_embd.weight", (v, h), "matrix")]
    for i in range(spec["layers"]):
        b = f"blk.{i}."
        out += [
            (b + "attn_norm.weight", (h,), "norm"),
            (b + "attn_q.weight", (nh * hd, h), "matrix"),
            (b + "attn_k.weight", (nkv * hd, h), "matrix"),
            (b + "attn_v.weight", (nkv * hd, h), "matrix"),
        ]
        if spec["qkv_bias"]:
            out += [
                (b + "attn_q.bias", (nh * hd,), "bias"),
                (b + "attn_k.bias", (nkv * hd,), "bias"),
                (b + "attn_v.bias", (nkv * hd,), "bias"),
            ]
        out += [
            (b + "attn_output.weight", (h, nh * hd), "matrix"),
            (b + "ffn_norm.weight", (h,), "norm"),
            (b + "ffn_gate.weight", (f, h), "matrix"),
            (b + "ffn_up.weight", (f, h), "matrix"),
            (b + "ffn_down.weight", (h, f), "matrix"),
        ]
    out.append(("output_norm.weight", (h,), "norm"))
    if not spec["tied"]:
        out.append(("output.weight", (v, h), "matrix"))
    return out


def values(spec, index, shape, kind):
    """The tensor's values: F32 for norms, F16 for the rest (what llama.cpp's converter writes)."""
    if kind == "norm":
        return np.ones(shape, dtype=np.float32)
    rng = np.random.default_rng([spec["seed"], index])
    fan_in = shape[-1] if kind == "matrix" else spec["hidden"]
    x = rng.standard_normal(shape, dtype=np.float32)
    x *= np.float32(1.0 / np.sqrt(fan_in))
    return x.astype(np.float16)


def vocabulary(tokenizer_gguf, vocab):
    """The tokenizer's tokens and types padded to `vocab`, and its other keys (name -> field)."""
    r = gguf.GGUFReader(tokenizer_gguf)
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    if len(tokens) > vocab:
        fail(f"the tokenizer has {len(tokens)} tokens, more than the shape's vocabulary of {vocab}")
    pad = vocab - len(tokens)
    tokens = list(tokens) + [f"[PAD{i}]" for i in range(pad)]
    types = list(types) + [int(gguf.TokenType.UNUSED)] * pad
    other = {k: r.fields[k] for k in TOKENIZER_KEYS if k in r.fields}
    return tokens, types, other


def add_field(w, key, field):
    """One GGUF key/value as the reader gave it."""
    kind = field.types[0]
    if kind == gguf.GGUFValueType.ARRAY:
        w.add_array(key, field.contents())
    elif kind == gguf.GGUFValueType.STRING:
        w.add_string(key, field.contents())
    elif kind == gguf.GGUFValueType.BOOL:
        w.add_bool(key, bool(field.contents()))
    elif kind == gguf.GGUFValueType.UINT32:
        w.add_uint32(key, int(field.contents()))
    else:
        fail(f"tokenizer key {key} of type {kind} is not copied")


def write_f16(spec, tokenizer_gguf, path):
    arch = spec["arch"]
    w = gguf.GGUFWriter(path, arch)
    w.add_name(f"random {spec['shape']} (make-model, seed {spec['seed']})")
    w.add_context_length(spec["context"])
    w.add_embedding_length(spec["hidden"])
    w.add_block_count(spec["layers"])
    w.add_feed_forward_length(spec["ffn"])
    w.add_head_count(spec["heads"])
    w.add_head_count_kv(spec["kv_heads"])
    w.add_rope_dimension_count(spec["head_dim"])
    w.add_rope_freq_base(spec["rope_theta"])
    w.add_layer_norm_rms_eps(spec["rms_eps"])
    w.add_vocab_size(spec["vocab"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    tokens, types, other = vocabulary(tokenizer_gguf, spec["vocab"])
    w.add_token_list(tokens)
    w.add_token_types(types)
    for key, field in other.items():
        add_field(w, key, field)
    plan = tensors(spec)
    for name, shape, kind in plan:
        dtype = np.float32 if kind == "norm" else np.float16
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        w.add_tensor_info(name, shape, np.dtype(dtype), nbytes)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for index, (name, shape, kind) in enumerate(plan):
        w.write_tensor_data(values(spec, index, shape, kind))
    w.close()


def quantize(src, dst, ftype, threads):
    params = L.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = threads
    rc = L.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
    if rc != 0:
        fail(f"llama_model_quantize returned {rc}")


def quiet_llama_cpp():
    # llama.cpp logs every tensor it loads and quantizes; the callback must outlive every call.
    global _silent
    _silent = L.llama_log_callback(lambda level, text, user: None)
    L.llama_log_set(_silent, ctypes.c_void_p())


def check_loads(path, threads):
    """llama.cpp loads `path` and decodes a few tokens."""
    L.llama_backend_init()
    mparams = L.llama_model_default_params()
    # The check is of the file, not of the CPU's extra buffer types (which crash on some VMs).
    mparams.use_extra_bufts = False
    model = L.llama_model_load_from_file(path.encode(), mparams)
    if not model:
        fail(f"llama.cpp cannot load {path}")
    p = L.llama_context_default_params()
    p.n_ctx, p.n_batch = 64, 64
    p.n_threads = p.n_threads_batch = threads
    ctx = L.llama_init_from_model(model, p)
    if not ctx:
        fail("llama.cpp cannot make a context")
    n = 8
    batch = L.llama_batch_init(n, 0, 1)
    for i in range(n):
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = 100 + i, i, 1
        batch.seq_id[i][0] = 0
        batch.logits[i] = 1 if i == n - 1 else 0
    batch.n_tokens = n
    rc = L.llama_decode(ctx, batch)
    L.llama_batch_free(batch)
    if rc != 0:
        fail(f"llama.cpp's decode of {path} returned {rc}")
    vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    logits = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(vocab,))
    if not np.isfinite(logits).all():
        fail(f"llama.cpp's logits of {path} are not finite")
    L.llama_free(ctx)
    L.llama_model_free(model)
    print(f"make_model: llama.cpp loads {os.path.basename(path)} ({vocab} tokens) and decodes", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", required=True)
    ap.add_argument("--tokenizer", required=True, help="the GGUF whose tokenizer the model gets")
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    quiet_llama_cpp()
    with open(args.spec) as f:
        spec = json.load(f)
    f16 = args.out + ".f16.partial"
    partial = args.out + ".partial"
    try:
        print(f"make_model: writing {spec['shape']} in F16", file=sys.stderr)
        write_f16(spec, args.tokenizer, f16)
        print(f"make_model: quantizing with llama.cpp (file type {spec['ftype']})", file=sys.stderr)
        quantize(f16, partial, spec["ftype"], args.threads)
    finally:
        if os.path.exists(f16):
            os.remove(f16)
    check_loads(partial, args.threads)
    # Whole or not at all: a run stopped half-way leaves no half file under the name.
    os.replace(partial, args.out)


if __name__ == "__main__":
    main()
