#!/usr/bin/env python3
"""PEFT's LoRA adapters over the tiny random models, with PEFT's merged-model logits: the
reference of the engine's LoRA (`model/tests/it/lora.rs`, `engine/tests/it/lora.rs`).

For each family below (the checkpoints of `../families/`), two adapters with random `A` and `B`
(fixed seeds; PEFT would start `B` at zero, which tests nothing):

- `sql`: rank 8, `lora_alpha` 16, on `q_proj`, `k_proj`, `v_proj`, `o_proj`;
- `chat`: rank 16, `lora_alpha` 8, rsLoRA, on `q_proj`, `v_proj`, `gate_proj`, `up_proj`,
  `down_proj`, layer 0 left out of `up_proj` (it has no pair there: its tensors are removed).

Each is saved by PEFT's `save_pretrained` into `<family>/<adapter>/` (`adapter_config.json`,
`adapter_model.safetensors`). `<family>/expected.json` holds, for the family's first three
prompts (`../families/<family>/expected.json`), each adapter's 8 greedy steps: the token ids and
the float32 logits of every step, from `merge_and_unload()`'s model (checked against the unmerged
PEFT model within 5e-4 first: the two round differently). Values are rounded to 7 significant digits.

Run by hand (it needs torch and peft) in the venv `../families/make.py` describes, with
`peft==0.21.2` added, from the repository root:

    /work/venv-hf/bin/python model/tests/data/lora/make.py
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import peft
import torch
import transformers
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

HERE = Path(__file__).resolve().parent
FAMILIES = HERE.parent / "families"
STEPS = 8
PROMPTS = 3
ADAPTERS = {
    "sql": dict(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], seed=11),
    "chat": dict(
        r=16,
        lora_alpha=8,
        use_rslora=True,
        target_modules=["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"],
        seed=12,
        drop="base_model.model.model.layers.0.mlp.up_proj.",
    ),
}
FAMILY_NAMES = ["llama", "qwen2"]


def r7(x: float) -> float:
    return float(f"{x:.7g}")


def randomize(model: torch.nn.Module, seed: int) -> None:
    """`A` ~ N(0, 1/in), `B` ~ N(0, 1/r): the delta is of the base projection's own size."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if "lora_A" in name or "lora_B" in name:
                fan_in = p.shape[1]
                p.copy_(torch.randn(p.shape, generator=g) / fan_in**0.5)


def greedy(model, prompt: list[int]) -> tuple[list[int], list[list[float]]]:
    ids = torch.tensor([prompt])
    tokens, rows = [], []
    with torch.no_grad():
        for _ in range(STEPS):
            logits = model(ids).logits[0, -1].float()
            rows.append(logits)
            t = int(torch.argmax(logits))
            tokens.append(t)
            ids = torch.cat([ids, torch.tensor([[t]])], dim=1)
    return tokens, rows


def make_family(family: str) -> None:
    base_dir = FAMILIES / family
    prompts = [g["prompt_ids"] for g in json.loads((base_dir / "expected.json").read_text())["generations"]][:PROMPTS]
    out = {"family": family, "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                                           "peft": peft.__version__}, "adapters": {}}
    for name, spec in ADAPTERS.items():
        spec = dict(spec)
        seed, drop = spec.pop("seed"), spec.pop("drop", None)
        base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32, attn_implementation="eager")
        model = get_peft_model(base, LoraConfig(task_type="CAUSAL_LM", lora_dropout=0.0, **spec))
        randomize(model, seed)
        folder = HERE / family / name
        shutil.rmtree(folder, ignore_errors=True)
        model.save_pretrained(folder)
        (folder / "README.md").unlink()  # PEFT's model card template
        config_path = folder / "adapter_config.json"
        config = json.loads(config_path.read_text())
        config["base_model_name_or_path"] = f"model/tests/data/families/{family}"
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        if drop:
            # A layer without a pair of a targeted module: PEFT computes no delta there.
            weights = folder / "adapter_model.safetensors"
            tensors = {k: v for k, v in load_file(weights).items() if not k.startswith(drop)}
            save_file(tensors, weights, metadata={"format": "pt"})
            with torch.no_grad():
                for k, p in model.named_parameters():
                    if k.startswith(drop) and "lora_B" in k:
                        p.zero_()
        model.eval()
        merged = copy.deepcopy(model).merge_and_unload()
        merged.eval()
        gens = []
        for prompt in prompts:
            tokens, rows = greedy(merged, prompt)
            check, check_rows = greedy(model, prompt)
            assert check == tokens, f"{family}/{name}: merged and unmerged greedy tokens differ"
            worst = max(float((a - b).abs().max()) for a, b in zip(rows, check_rows))
            assert worst < 5e-4, f"{family}/{name}: merged vs unmerged logits differ by {worst}"
            gaps = [float(torch.topk(r, 2).values[0] - torch.topk(r, 2).values[1]) for r in rows]
            gens.append({"prompt_ids": prompt, "greedy_ids": tokens, "min_top2_gap": r7(min(gaps)),
                         "logits": [[r7(v) for v in r.tolist()] for r in rows]})
        out["adapters"][name] = gens
        print(f"{family}/{name}: {sum(p.numel() for n, p in model.named_parameters() if 'lora_' in n)} LoRA values")
    (HERE / family / "expected.json").write_text(json.dumps(out) + "\n")


def main() -> None:
    for family in FAMILY_NAMES:
        make_family(family)


if __name__ == "__main__":
    main()
