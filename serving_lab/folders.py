"""A folder written whole or not at all: the report and the course site are built beside their destination and
renamed into place, so a failed or interrupted build never leaves a half-written folder behind."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def replaced_whole(out: str | Path) -> Iterator[Path]:
    """Yield an empty folder beside `out` to build in; when the block ends, it replaces `out` (whatever was there
    goes); when the block raises, it is removed and `out` is left as it was."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp's folder is private; the result is an ordinary folder
    try:
        yield tmp
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
