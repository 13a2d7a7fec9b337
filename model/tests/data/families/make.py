#!/usr/bin/env python3
"""Tiny random-weight models of every supported family, with Hugging Face transformers' logits.

Writes, for each family below, a folder `<name>/` beside this script holding an ordinary Hugging
Face checkpoint (config.json, generation_config.json, model.safetensors in float32, a 384-token
SentencePiece BPE tokenizer as tokenizer.model + tokenizer.json + tokenizer_config.json),
`expected.json` (transformers' float32 eager-attention logits: see `expected()`), and, where
llama.cpp's converter takes the family, `model.gguf` (an F32 GGUF of the same weights).

Run by hand, not in CI (it needs torch). From the repository root:

    python3.11 -m venv /work/venv-hf
    /work/venv-hf/bin/pip install torch==2.9.1 transformers==4.57.6 tokenizers==0.22.2 \
        safetensors==0.8.0 sentencepiece==0.2.1 numpy==2.4.6 protobuf==7.36.2
    # llama.cpp's converter (convert_hf_to_gguf.py + conversion/ + gguf-py/) from the
    # llama-cpp-python 0.3.36 sdist:
    mkdir -p /work/llcpp-src && cd /work/llcpp-src && \
        /work/venv-hf/bin/pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d . && \
        tar xzf llama_cpp_python-0.3.36.tar.gz && cd -
    /work/venv-hf/bin/python model/tests/data/families/make.py \
        --llama-cpp /work/llcpp-src/llama_cpp_python-0.3.36/vendor/llama.cpp

(PyPI's torch wheel needs its nvidia-* dependencies even to import on a CPU-only machine, so it is
installed normally, a few GB; everything here runs on the CPU.) `--llama-cpp` may be left out:
then no GGUF is written. `--only NAME` makes one family. The output is deterministic: fixed
seeds for the tokenizer corpus, the weights and the prompts.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import sentencepiece as spm
import torch
import transformers
from transformers import AutoModelForCausalLM, LlamaTokenizerFast

HERE = Path(__file__).resolve().parent
VOCAB = 384
MAX_POS = 128
HEAD_DIM = 64
BOS, EOS = 1, 2
STEPS = 8
PROMPT_LENS = (5, 12, 64)
MIN_GAP = 0.01
# The windowed families also get prompts that cross their windows many times (spec "long_prompts"),
# with room for them and their greedy steps (spec "max_pos").
LONG_PROMPT_LENS = (120, 200)
LONG_MAX_POS = 256

# Hidden size below heads × head_dim (64 < 4 × 64) keeps the files small while the attention
# stays at head_dim 64; Phi-3 (head_dim = hidden / heads in transformers and llama.cpp) is the
# exception. Llama, Mistral and Qwen3 have 4 query heads on 2 KV heads (so a wrong head grouping
# shows); the others 2 on 1, to keep the files small.
SMALL = dict(num_attention_heads=2, num_key_value_heads=1)
COMMON = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=HEAD_DIM, max_position_embeddings=MAX_POS,
    rms_norm_eps=1e-6, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=0,
)


def families() -> dict[str, dict]:
    """name -> {"config": transformers config, "norm_identity": value of an identity norm weight,
    "exercises": what the family checks, "config_patch": keys changed in config.json after saving,
    "long_prompts": prompt lengths beyond PROMPT_LENS (their own prompt seed), "max_pos":
    max_position_embeddings when not MAX_POS}."""
    from transformers import (Gemma3TextConfig, LlamaConfig, MistralConfig, Phi3Config, Qwen2Config,
                              Qwen3Config)

    half = HEAD_DIM // 2
    # Phi-3's LongRoPE divisors: short ones near 1, long ones growing to 8 (all different).
    short_factor = [round(1.0 + 0.5 * i / (half - 1), 4) for i in range(half)]
    long_factor = [round(1.0 + 7.0 * (i / (half - 1)) ** 1.5, 4) for i in range(half)]
    return {
        "llama": dict(
            config=LlamaConfig(**COMMON, rope_theta=500000.0, tie_word_embeddings=False,
                               rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                             "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
            exercises="GQA 4/2, llama3 rope_scaling (original 32: every band of the blend is used), untied head",
        ),
        "llama-tied": dict(
            config=LlamaConfig(**{**COMMON, **SMALL}, rope_theta=10000.0,
                               tie_word_embeddings=True),
            exercises="GQA 2/1, tied embeddings, plain RoPE",
        ),
        "mistral": dict(
            config=MistralConfig(**{**COMMON, "max_position_embeddings": LONG_MAX_POS}, rope_theta=10000.0,
                                 sliding_window=32, tie_word_embeddings=False),
            long_prompts=LONG_PROMPT_LENS,
            max_pos=LONG_MAX_POS,
            exercises="sliding_window 32 on every layer (the 64-, 120- and 200-token prompts cross it)",
        ),
        "qwen2": dict(
            config=Qwen2Config(**{**COMMON, **SMALL}, rope_theta=10000.0, tie_word_embeddings=True, use_sliding_window=False,
                               max_window_layers=1,
                               rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                             "original_max_position_embeddings": 32}),
            # As in Qwen2.5's own configs: a sliding_window value that use_sliding_window=false turns
            # off (transformers reads it as None), and no layer_types.
            config_patch={"sliding_window": 32, "layer_types": None},
            exercises="q/k/v biases, YaRN (factor 4, original 32), tied embeddings, sliding window off "
                      "(sliding_window 32 with use_sliding_window false)",
        ),
        "qwen3": dict(
            config=Qwen3Config(**COMMON, rope_theta=1000000.0, tie_word_embeddings=False, attention_bias=False,
                               use_sliding_window=False),
            exercises="q_norm/k_norm, no biases, head_dim 64 set explicitly (hidden 64)",
        ),
        "gemma3": dict(
            config=Gemma3TextConfig(**{**COMMON, **SMALL, "num_hidden_layers": 4,
                                       "max_position_embeddings": LONG_MAX_POS}, rope_theta=1000000.0,
                                    rope_local_base_freq=10000.0, sliding_window=16, sliding_window_pattern=2,
                                    query_pre_attn_scalar=48, rope_scaling={"rope_type": "linear", "factor": 8.0},
                                    final_logit_softcapping=None, attn_logit_softcapping=None,
                                    hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True),
            config_patch={"sliding_window_pattern": 2},
            norm_identity=0.0,
            # Gemma scales the embedding by sqrt(hidden) and post-norms every branch to unit size:
            # with a tied head the input token's own logit would win every step. A small embedding
            # and branch norms of ~4 (and a final norm of ~2) let the layers decide.
            embed_std=0.1,
            norm_centers={"post_attention_layernorm": 3.0, "post_feedforward_layernorm": 3.0, "model.norm": 1.0},
            long_prompts=LONG_PROMPT_LENS,
            max_pos=LONG_MAX_POS,
            exercises="Gemma's 1+w norms (4 per layer + q/k norms), embedding × sqrt(hidden), tanh GELU, "
                      "sliding/full layers (window 16, pattern 2), query_pre_attn_scalar 48, linear rope "
                      "factor 8 on full layers only, local rope base 10000, tied embeddings",
        ),
        "phi3": dict(
            config=Phi3Config(**{**{k: v for k, v in COMMON.items() if k != "head_dim"}, "hidden_size": 128,
                                 **SMALL, "intermediate_size": 64},
                              rope_theta=10000.0, original_max_position_embeddings=32, sliding_window=None,
                              rope_scaling={"type": "longrope", "short_factor": short_factor,
                                            "long_factor": long_factor},
                              tie_word_embeddings=False),
            exercises="fused qkv_proj and gate_up_proj, LongRoPE (short factors while the sequence fits "
                      "original_max_position_embeddings 32, long ones beyond; attention factor from 128/32), "
                      "GQA 2/1, no sliding window",
        ),
    }


def corpus(n_lines: int = 3000) -> list[str]:
    """A deterministic English-like corpus for the tokenizer."""
    words = ("the a an of to in and or but if then when while for with without on at by from into over "
             "model token layer head weight value key query cache block batch step prompt logit vector "
             "small large quick slow red blue green bright dark old new first last next every some many "
             "runs reads writes keeps moves turns holds finds makes takes gives sees knows thinks says "
             "river mountain city garden window table letter number music water light stone cloud "
             "Rust Python engine kernel thread memory tensor matrix rotary window sliding norm").split()
    rng = random.Random(1234)
    lines = []
    for _ in range(n_lines):
        n = rng.randint(4, 14)
        s = " ".join(rng.choice(words) for _ in range(n))
        s = s[0].upper() + s[1:] + rng.choice([".", ".", "!", "?", ", 42.", " (1997)."])
        lines.append(s)
    return lines


def make_tokenizer(workdir: Path) -> Path:
    """A SentencePiece BPE model of VOCAB pieces: <unk> 0, <s> 1, </s> 2, 256 byte pieces, merges."""
    prefix = workdir / "tokenizer"
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus()), model_prefix=str(prefix), vocab_size=VOCAB, model_type="bpe",
        byte_fallback=True, character_coverage=1.0, unk_id=0, bos_id=BOS, eos_id=EOS, pad_id=-1,
        num_threads=1, split_digits=True, minloglevel=2, normalization_rule_name="identity",
    )
    sp = spm.SentencePieceProcessor(model_file=str(prefix) + ".model")
    assert sp.get_piece_size() == VOCAB, sp.get_piece_size()
    return Path(str(prefix) + ".model")


def save_tokenizer(spm_model: Path, folder: Path) -> None:
    """tokenizer.model, tokenizer.json (converted by transformers) and tokenizer_config.json."""
    tok = LlamaTokenizerFast(vocab_file=str(spm_model), from_slow=True, legacy=False, add_bos_token=True,
                             add_eos_token=False, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    assert len(tok) == VOCAB, len(tok)
    tok.save_pretrained(str(folder))
    assert (folder / "tokenizer.model").exists() and (folder / "tokenizer.json").exists()


def randomize(model: torch.nn.Module, seed: int, norm_identity: float, embed_std: float,
              norm_centers: dict[str, float]) -> None:
    """Fixed-seed weights of sizes that keep every layer's output at the residual's scale:
    matrices uniform with std 1/sqrt(fan_in), norms identity ± 0.3 (so a norm convention
    mismatch shows), biases ±0.5, embeddings std 1 (`embed_std` when tied, std 3/sqrt(hidden) for an
    untied head), so logits have a std of a few units and greedy steps vary. `norm_centers`: norms
    (by name part) centred elsewhere than the identity."""
    g = torch.Generator().manual_seed(seed)

    def uniform(shape, std):
        a = std * math.sqrt(3.0)
        return (torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1) * a

    tied = model.config.tie_word_embeddings
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                center = next((c for k, c in norm_centers.items() if k in name), norm_identity)
                v = center + uniform(p.shape, 0.3 / math.sqrt(3.0))
            elif name.endswith(".bias"):
                v = uniform(p.shape, 0.5 / math.sqrt(3.0))
            elif "embed_tokens" in name:
                v = uniform(p.shape, embed_std if tied else 1.0)
            elif name == "lm_head.weight":
                v = uniform(p.shape, 3.0 / math.sqrt(p.shape[1]))
            else:
                assert p.dim() == 2, name
                # With a tied head the residual must move away from the input token's embedding,
                # else greedy decoding repeats it: the layers' output projections get a gain.
                out_proj = name.endswith(("o_proj.weight", "down_proj.weight"))
                v = uniform(p.shape, (2.5 if tied and out_proj else 1.0) / math.sqrt(p.shape[1]))
            p.copy_(v.to(torch.float32))


def prompts(seed: int, lens: tuple[int, ...] = PROMPT_LENS) -> list[list[int]]:
    rng = random.Random(seed)
    return [[BOS] + [rng.randrange(3, VOCAB) for _ in range(n - 1)] for n in lens]


def r7(x: float) -> float:
    return float(f"{x:.7g}")


def expected(model, prompt_list: list[list[int]]) -> list[dict]:
    """For each prompt, STEPS greedy steps, each a full forward pass over prompt + tokens so far
    (no KV cache): `logits[i]` is the last position's logits at step i (`logits[0]` the first
    step's), `greedy_ids[i]` its argmax. `min_top2_gap`: the smallest top-1 − top-2 logit margin
    over the steps (how safe the greedy comparison is)."""
    out = []
    for ids in prompt_list:
        seq = list(ids)
        steps, gaps = [], []
        for _ in range(STEPS):
            with torch.no_grad():
                logits = model(torch.tensor([seq])).logits[0, -1].to(torch.float32)
            top = torch.topk(logits, 2).values
            gaps.append(float(top[0] - top[1]))
            tok = int(torch.argmax(logits))
            steps.append([r7(v) for v in logits.tolist()])
            seq.append(tok)
        out.append({"prompt_ids": ids, "greedy_ids": seq[len(ids):], "min_top2_gap": r7(min(gaps)),
                    "logits_std": r7(float(torch.tensor(steps[0]).std())), "logits": steps})
    return out


def clear_prompts(name: str, model, first_seed: int, lens: tuple[int, ...]) -> list[dict]:
    """`expected()` of the prompts of `lens` from the first seed from `first_seed` on whose greedy
    steps all have a top-1 − top-2 margin of at least MIN_GAP."""
    for prompt_seed in range(first_seed, first_seed + 49):
        gens = expected(model, prompts(prompt_seed, lens))
        if min(g["min_top2_gap"] for g in gens) >= MIN_GAP:
            return gens
    raise RuntimeError(f"{name}: no prompt seed without a near-tie for lengths {lens}")


def patch_config(folder: Path, patch: dict) -> None:
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    for k, v in patch.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def convert_gguf(llama_cpp: Path, folder: Path) -> str:
    """Runs llama.cpp's converter; returns "ok" or why it failed."""
    out = folder / "model.gguf"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, str(llama_cpp / "convert_hf_to_gguf.py"), str(folder), "--outtype", "f32",
           "--outfile", str(out)]
    r = subprocess.run(cmd, cwd=llama_cpp, capture_output=True, text=True)
    if r.returncode != 0 or not out.exists():
        tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
        return "failed: " + " | ".join(tail)
    return "ok"


def make_family(name: str, spec: dict, spm_model: Path, seed: int, llama_cpp: Path | None) -> dict:
    folder = HERE / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(spec["config"], attn_implementation="eager", torch_dtype=torch.float32)
    randomize(model, seed, spec.get("norm_identity", 1.0), spec.get("embed_std", 0.5), spec.get("norm_centers", {}))
    model.save_pretrained(str(folder), safe_serialization=True)
    if spec.get("config_patch"):
        patch_config(folder, spec["config_patch"])
    save_tokenizer(spm_model, folder)
    # The reference comes from the folder as written (config patches included), reloaded.
    model = AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager", torch_dtype=torch.float32)
    model.eval()
    # Prompts whose greedy steps are all clear of near-ties (top-1 − top-2 ≥ MIN_GAP), so that an
    # engine within the logits tolerance makes the same choices: the first such prompt seed. The
    # long prompts have a seed of their own (from seed + 1001), so the short ones stay as they were.
    gens = clear_prompts(name, model, seed + 1, PROMPT_LENS)
    if spec.get("long_prompts"):
        gens += clear_prompts(name, model, seed + 1001, spec["long_prompts"])
    cfg = model.config
    assert cfg.max_position_embeddings == spec.get("max_pos", MAX_POS), name
    assert all(len(g["prompt_ids"]) + STEPS <= cfg.max_position_embeddings for g in gens), name
    meta = {
        "family": name, "architecture": cfg.architectures[0], "model_type": cfg.model_type,
        "exercises": spec["exercises"],
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__},
        "attn_implementation": "eager", "dtype": "float32",
        "layer_types": getattr(cfg, "layer_types", None),
        "generations": gens,
    }
    gguf = convert_gguf(llama_cpp, folder) if llama_cpp else "not attempted"
    meta["gguf"] = gguf
    (folder / "expected.json").write_text(json.dumps(meta, separators=(",", ":")) + "\n")
    sizes = {p.name: p.stat().st_size for p in sorted(folder.iterdir())}
    print(f"{name}: gguf {gguf}; greedy {[g['greedy_ids'] for g in gens]}; "
          f"min gaps {[g['min_top2_gap'] for g in gens]}; logit std {[g['logits_std'] for g in gens]}; "
          f"sizes {sizes}", flush=True)
    return meta


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-cpp", type=Path, help="llama.cpp source tree holding convert_hf_to_gguf.py")
    ap.add_argument("--only", action="append", help="make only this family (repeatable)")
    args = ap.parse_args()
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    fams = families()
    with tempfile.TemporaryDirectory() as tmp:
        spm_model = make_tokenizer(Path(tmp))
        for i, (name, spec) in enumerate(fams.items()):
            if args.only and name not in args.only:
                continue
            make_family(name, spec, spm_model, seed=100 + 10 * i, llama_cpp=args.llama_cpp)


if __name__ == "__main__":
    main()
