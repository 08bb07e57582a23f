"""Where Serving Lab keeps what it downloads or measures: the default model and calibrated profiles.

One folder for both, `$SERVING_LAB_CACHE` or else `~/.cache/serving-lab`, so a learner who moves it moves
everything. It lives in the torch-free core because the simulator reads saved profiles from it too.

Lesson: lessons/00-orientation.md (set-up: the model is pulled once into the cache folder).
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """`$SERVING_LAB_CACHE` (a `~` in it expanded), else `~/.cache/serving-lab`; not created here."""
    return Path(os.environ.get("SERVING_LAB_CACHE") or "~/.cache/serving-lab").expanduser()
