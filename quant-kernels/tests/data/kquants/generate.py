#!/usr/bin/env python3
"""Generates the ggml (de)quantization fixtures that quant-kernels/src/ggml/{dequant,quantize}.rs test against.

The expected values come from gguf-py's `gguf.quants` (llama.cpp's numpy port of ggml-quants.c), so the
Rust tests compare against the reference without needing Python at test time.

Run:  python3 -m venv /tmp/venv-gguf && /tmp/venv-gguf/bin/pip install gguf numpy
      /tmp/venv-gguf/bin/python quant-kernels/tests/data/kquants/generate.py
Generated with gguf 0.19.0, numpy 2.4.x. Output is deterministic (fixed seed).

Files (all little-endian, no headers):
  q4_k.bin / q6_k.bin   raw blocks of random bytes with sane f16 scales (8 blocks each)
  q4_k.f32 / q6_k.f32   gguf-py's dequantization of those blocks
  src.f32               64 rows of 32 f32 (crafted edge cases first, then random at varied scales)
  q4_0.bin / q4_1.bin / q8_0.bin / f16.bin / bf16.bin
                        gguf-py's quantization of src.f32
  q4_0.f32 / q4_1.f32 / q8_0.f32
                        gguf-py's dequantization of the quantized blocks above
  q5_0.bin / q5_1.bin / q5_k.bin
                        raw blocks of random bytes with sane f16 scales (64, 64 and 8 blocks)
  q5_0.f32 / q5_1.f32 / q5_k.f32
                        gguf-py's dequantization of those blocks
"""

import os

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

OUT = os.path.dirname(os.path.abspath(__file__))
QK_K = 256
rng = np.random.default_rng(20240611)


def write(name: str, arr: np.ndarray) -> None:
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(np.ascontiguousarray(arr).tobytes())


def f16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).view(np.uint8).reshape(-1, 2)


def k_blocks(n_blocks: int, block_bytes: int) -> np.ndarray:
    return rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)


# Random f16 scales spanning several magnitudes (one subnormal), all finite.
def scales(n: int) -> np.ndarray:
    s = rng.standard_normal(n) * 10.0 ** rng.uniform(-4, 1, n)
    s[0] = 3e-6  # f16 subnormal
    return s


# --- Q4_K: d f16, dmin f16, scales[12], qs[128] = 144 bytes ---------------------------------
q4k = k_blocks(8, 144)
q4k[:, 0:2] = f16_bytes(scales(8))
q4k[:, 2:4] = f16_bytes(np.abs(scales(8)))
write("q4_k.bin", q4k)
write("q4_k.f32", quants.dequantize(q4k.reshape(-1), T.Q4_K).astype(np.float32))

# --- Q6_K: ql[128], qh[64], scales[16] (i8), d f16 = 210 bytes ------------------------------
q6k = k_blocks(8, 210)
q6k[:, 208:210] = f16_bytes(scales(8))
write("q6_k.bin", q6k)
write("q6_k.f32", quants.dequantize(q6k.reshape(-1), T.Q6_K).astype(np.float32))

# --- f32 rows for the reference quantizers --------------------------------------------------
rows = []
rows.append(np.zeros(32))  # d = 0 → id = 0 path
rows.append(np.full(32, 3.0))  # constant (Q4_1: d = 0 with min ≠ 0)
# Q8_0 ties: amax 127 → d = 1, so x·id lands exactly on .5; roundf rounds away from zero.
rows.append(np.array([127.0] + [k + 0.5 for k in range(-15, 16)]))
# Q4_0: the max-magnitude value is -8 → d = 1, so x + 8.5 is exact.
rows.append(np.array([-8.0] + [k * 0.5 for k in range(-15, 16)]))
# A positive max-magnitude value (d < 0 for Q4_0) and one outlier among tiny values.
big = np.full(32, 1e-3)
big[17] = 50.0
rows.append(big)
rows.append(rng.standard_normal(32) * 1e-6)  # f16-subnormal d
rows.append(-np.abs(rng.standard_normal(32)))  # all negative
for _ in range(64 - len(rows)):
    rows.append(rng.standard_normal(32) * 10.0 ** rng.uniform(-3, 2))
src = np.stack(rows).astype(np.float32)
write("src.f32", src)

for name, ty in [("q4_0", T.Q4_0), ("q4_1", T.Q4_1), ("q8_0", T.Q8_0)]:
    q = quants.quantize(src, ty)
    write(f"{name}.bin", q)
    write(f"{name}.f32", quants.dequantize(q, ty).astype(np.float32))
write("f16.bin", quants.quantize(src, T.F16))
write("bf16.bin", quants.quantize(src, T.BF16))

# --- Q5_0 / Q5_1 / Q5_K raw blocks, drawn last so that every fixture above keeps its draws -----
# Q5_0: d f16, qh[4], qs[16] = 22 bytes; Q5_1: d f16, m f16, qh[4], qs[16] = 24 bytes;
# Q5_K: d f16, dmin f16, scales[12], qh[32], qs[128] = 176 bytes.
q50 = k_blocks(64, 22)
q50[:, 0:2] = f16_bytes(scales(64))
write("q5_0.bin", q50)
write("q5_0.f32", quants.dequantize(q50.reshape(-1), T.Q5_0).astype(np.float32))
q51 = k_blocks(64, 24)
q51[:, 0:2] = f16_bytes(scales(64))
q51[:, 2:4] = f16_bytes(scales(64))
write("q5_1.bin", q51)
write("q5_1.f32", quants.dequantize(q51.reshape(-1), T.Q5_1).astype(np.float32))
q5k = k_blocks(8, 176)
q5k[:, 0:2] = f16_bytes(scales(8))
q5k[:, 2:4] = f16_bytes(np.abs(scales(8)))
write("q5_k.bin", q5k)
write("q5_k.f32", quants.dequantize(q5k.reshape(-1), T.Q5_K).astype(np.float32))
