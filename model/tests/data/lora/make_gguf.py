#!/usr/bin/env python3
"""llama.cpp's LoRA GGUFs of the PEFT adapters here, with llama.cpp's own logits over them: the
reference of the engine's GGUF adapter loading (`model/tests/it/lora.rs`).

Two steps, each in the venv that has what it needs, from the repository root:

1. ``convert LLAMA_CPP``: llama.cpp's ``convert_lora_to_gguf.py`` (from the source tree
   ``LLAMA_CPP``, the llama-cpp-python 0.3.36 sdist's ``vendor/llama.cpp``, as the peer bench
   builds) turns ``<family>/<adapter>/`` into ``<family>/<adapter>.gguf`` over the base folder
   ``../families/<family>``, in f32 (with f16 tensors llama.cpp rounds the activations to
   f16 for the LoRA products too, some 1e-3 off f32 math): Llama's ``sql`` and ``chat``, Qwen2's
   ``sql`` (checked against PEFT's logits directly: llama.cpp cannot
   run the tiny Qwen2, whose head size is not hidden / heads).
   Needs torch and transformers (the venv ``make.py`` names)::

       PYTHONPATH=$LLAMA_CPP/gguf-py /work/venv-hf/bin/python model/tests/data/lora/make_gguf.py convert $LLAMA_CPP

2. ``reference``: llama-cpp-python loads ``../families/llama/model.gguf`` with each adapter
   GGUF (an f32 KV cache, so that nothing is rounded to f16) and writes
   ``llama/expected_gguf.json``: for the first three prompts of the family, 8 greedy steps'
   token ids and float32 logits (7 significant digits), in ``expected.json``'s shape. llama.cpp
   scales by ``alpha / r`` whatever the adapter's rsLoRA setting (its converter keeps
   ``lora_alpha`` as it is), so ``chat``'s figures are llama.cpp's, not PEFT's; ``sql``'s match
   PEFT's (checked here within 1e-3)::

       target/venv-llamacpp/bin/python model/tests/data/lora/make_gguf.py reference
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
FAMILIES = HERE.parent / "families"
CONVERSIONS = [("llama", "sql", "f32"), ("llama", "chat", "f32"), ("qwen2", "sql", "f32")]
STEPS = 8
PROMPTS = 3


def r7(x: float) -> float:
    return float(f"{x:.7g}")


def convert(llama_cpp: Path) -> None:
    for family, adapter, outtype in CONVERSIONS:
        out = HERE / family / f"{adapter}.gguf"
        subprocess.run(
            [sys.executable, str(llama_cpp / "convert_lora_to_gguf.py"), "--base", str(FAMILIES / family),
             "--outtype", outtype, "--outfile", str(out), str(HERE / family / adapter)],
            check=True,
        )
        print(f"wrote {out.relative_to(HERE)}")


def reference() -> None:
    import llama_cpp
    import numpy as np

    for family in ["llama"]:
        base = FAMILIES / family
        prompts = [g["prompt_ids"] for g in json.loads((base / "expected.json").read_text())["generations"]][:PROMPTS]
        peft = json.loads((HERE / family / "expected.json").read_text())["adapters"]
        out = {"family": family, "llama_cpp_python": llama_cpp.__version__, "adapters": {}}
        for adapter in [a for f, a, _ in CONVERSIONS if f == family]:
            llm = llama_cpp.Llama(model_path=str(base / "model.gguf"), lora_path=str(HERE / family / f"{adapter}.gguf"),
                                  n_ctx=128, n_threads=1, type_k=0, type_v=0, logits_all=True, verbose=False)
            gens = []
            for p, prompt in enumerate(prompts):
                llm.reset()
                llm.eval(prompt)
                tokens, rows = [], []
                for _ in range(STEPS):
                    row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
                    rows.append(row)
                    tokens.append(int(row.argmax()))
                    llm.eval([tokens[-1]])
                if adapter == "sql":
                    want = peft[adapter][p]
                    assert tokens == want["greedy_ids"], (family, p, tokens, want["greedy_ids"])
                    worst = max(float(np.abs(r - np.array(w)).max()) for r, w in zip(rows, want["logits"]))
                    assert worst < 1e-3, (family, p, worst)
                gens.append({"prompt_ids": prompt, "greedy_ids": tokens,
                             "logits": [[r7(v) for v in r.tolist()] for r in rows]})
            out["adapters"][adapter] = gens
        path = HERE / family / "expected_gguf.json"
        path.write_text(json.dumps(out) + "\n")
        print(f"wrote {path.relative_to(HERE)}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["convert"] and len(sys.argv) == 3:
        convert(Path(sys.argv[2]))
    elif sys.argv[1:] == ["reference"]:
        reference()
    else:
        sys.exit(__doc__)
