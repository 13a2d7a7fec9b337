#!/usr/bin/env python3
"""Phi-3's short prompts at a long context, as transformers computes them: `phi3/expected_long_context.json`.

transformers picks LongRoPE's factors per forward pass from the sequence's own length (the short
ones while `max(position_ids) + 1 <= original_max_position_embeddings`), while a server with a
`max_model_len` past the original context (vLLM, this engine) rotates every sequence with the long
factors, so that a sequence's cached keys never mix the two. This script loads the committed
`phi3/` folder with transformers, its short factors replaced by its long ones in the loaded config
(nothing else changes: the attention factor is the same for both), and runs `make.py`'s
`expected()` over the committed expected.json's prompts that stay within the original context.

Run by hand (it needs torch), in make.py's venv, from the repository root:

    /work/venv-hf/bin/python model/tests/data/families/make_long_context.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from make import STEPS, expected  # noqa: E402


def main() -> None:
    torch.set_num_threads(2)
    folder = HERE / "phi3"
    committed = json.loads((folder / "expected.json").read_text())
    config = AutoConfig.from_pretrained(str(folder))
    original = config.original_max_position_embeddings
    config.rope_scaling = {**config.rope_scaling, "short_factor": list(config.rope_scaling["long_factor"])}
    model = AutoModelForCausalLM.from_pretrained(
        str(folder), config=config, attn_implementation="eager", torch_dtype=torch.float32)
    model.eval()
    short = [g["prompt_ids"] for g in committed["generations"] if len(g["prompt_ids"]) + STEPS - 1 <= original]
    gens = expected(model, short)
    meta = {
        "family": "phi3", "note": "the short prompts of expected.json with the long LongRoPE factors "
        "(a served context past original_max_position_embeddings); see make_long_context.py",
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__},
        "attn_implementation": "eager", "dtype": "float32", "generations": gens,
    }
    (folder / "expected_long_context.json").write_text(json.dumps(meta, separators=(",", ":")) + "\n")
    print(f"phi3 long context: {len(gens)} prompts; greedy {[g['greedy_ids'] for g in gens]}; "
          f"min gaps {[g['min_top2_gap'] for g in gens]}")


if __name__ == "__main__":
    main()
