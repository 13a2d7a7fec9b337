#!/usr/bin/env python3
"""transformers' pooled hidden states of every tiny family, the reference of the engine's
embeddings (`engine/tests/it/embeddings.rs`).

Writes `<family>/embeddings.json` beside each family's `expected.json`: for each of that file's
prompts (the same ids), the final hidden states of the base model (`last_hidden_state`: after
the final norm, what `output_hidden_states`' last entry also holds, checked here) pooled four
ways, as vLLM's embedding pooler does it:

- `last`: the last token's state; `mean`: the mean over every token's state (both raw);
- `last_normalized`: `F.normalize(last)`;
- `mean_dim32_normalized`: `F.normalize(mean[:32])` (`dimensions: 32`, matryoshka-style:
  truncated first, then normalised).

Values are rounded to 7 significant digits. Run by hand (it needs torch), in the venv
`make.py`'s docstring describes, from the repository root:

    /work/venv-hf/bin/python model/tests/data/families/make_embeddings.py
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers
from transformers import AutoModelForCausalLM

HERE = Path(__file__).resolve().parent
FAMILIES = ["llama", "llama-tied", "mistral", "qwen2", "qwen3", "gemma3", "phi3"]
DIMENSIONS = 32


def r7(x: float) -> float:
    return float(f"{x:.7g}")


def vec(t: torch.Tensor) -> list[float]:
    return [r7(v) for v in t.to(torch.float32).tolist()]


def pooled(model, ids: list[int]) -> dict:
    with torch.no_grad():
        inputs = torch.tensor([ids])
        base = model.model(inputs).last_hidden_state[0]
        recorded = model(inputs, output_hidden_states=True).hidden_states[-1][0]
    # The two ways transformers gives the final states agree (the final norm applied).
    assert torch.allclose(base, recorded, rtol=0, atol=0), "last_hidden_state != hidden_states[-1]"
    last, mean = base[-1], base.mean(dim=0)
    return {
        "prompt_ids": ids,
        "last": vec(last),
        "mean": vec(mean),
        "last_normalized": vec(F.normalize(last, dim=-1)),
        "mean_dim32_normalized": vec(F.normalize(mean[:DIMENSIONS], dim=-1)),
    }


def main() -> None:
    torch.manual_seed(0)
    for name in FAMILIES:
        folder = HERE / name
        expected = json.loads((folder / "expected.json").read_text())
        model = AutoModelForCausalLM.from_pretrained(
            folder, dtype=torch.float32, attn_implementation="eager"
        ).eval()
        prompts = [g["prompt_ids"] for g in expected["generations"]]
        out = {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "dimensions": DIMENSIONS,
            "prompts": [pooled(model, ids) for ids in prompts],
        }
        (folder / "embeddings.json").write_text(json.dumps(out, indent=1) + "\n")
        print(f"{name}: {len(prompts)} prompts, hidden {len(out['prompts'][0]['last'])}")


if __name__ == "__main__":
    main()
