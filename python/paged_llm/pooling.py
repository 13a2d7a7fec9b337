"""``PoolingParams``: how ``LLM.embed`` turns a prompt's final hidden states into one vector, with
vLLM's field names."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional


@dataclass
class PoolingParams:
    #: ``"LAST"`` (the last token's state, what a causal decoder has read the prompt into) or
    #: ``"MEAN"`` (the mean over every token's state).
    pooling_type: str = "LAST"
    #: L2-normalise the vector (after ``dimensions`` cut it).
    normalize: bool = True
    #: Keep only the first this many values (at most the model's hidden size).
    dimensions: Optional[int] = None

    def _json(self) -> str:
        return json.dumps(
            {"pooling_type": self.pooling_type.upper(), "normalize": self.normalize, "dimensions": self.dimensions}
        )
