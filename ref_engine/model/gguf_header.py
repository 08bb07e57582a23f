"""A GGUF file's header: its metadata and where each tensor's data lies, parsed once per cached file.

Why this exists: gguf's `GGUFReader` reads every metadata value through a numpy slice of the memory-mapped
file, one array element at a time. SmolLM2's header holds 49,152 vocabulary strings and 48,900 merges, so
the parse takes ~4.5 s on a 2-core CPU, and every notebook, server engine core and tensor-parallel worker
that opens the default model paid it again.

The header is all the loader needs of that parse: the metadata values, and for each tensor its name, type,
GGUF shape and the numpy dtype, shape and byte offset of its raw data in the file. For a file in the cache
folder (`core.paths.cache_dir`, where the default model is pulled) the first open parses with `GGUFReader`
and writes that down beside the file as `<name>.header.json`, atomically; later opens read the JSON and map
each tensor's data from the file with the same dtype, shape and offset, so every array equals the reader's.
The JSON names the file's size and modification time and gguf's version: a file that changed, or another
gguf, gets a fresh parse. Files elsewhere (a user's, a test's) are parsed every time and nothing is written
beside them.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QType

from core.paths import cache_dir

FORMAT = 1  # of the JSON below; a change of it re-parses every file
SUFFIX = ".header.json"


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of the file: what `gguf.ReaderTensor` gives the loader, and no more."""

    name: str
    tensor_type: QType
    shape: list[int]  # GGUF's order, innermost dimension first
    data: np.ndarray  # the raw data as stored (quantized blocks as bytes), mapped from the file


@dataclass(frozen=True)
class GGUFHeader:
    metadata: dict[str, Any]
    tensors: list[GGUFTensor]


def read_header(path: str | Path) -> GGUFHeader:
    """The header of the GGUF file at `path`: from its saved parse where one is valid, else parsed (and,
    for a file in the cache folder, saved)."""
    path = Path(path)
    cached = path.resolve().is_relative_to(cache_dir().resolve())
    stamp = _stamp(path)
    if cached and (saved := _saved(path, stamp)) is not None:
        return saved
    reader = gguf.GGUFReader(path)
    header = GGUFHeader(
        metadata={name: field.contents() for name, field in reader.fields.items()},
        tensors=[GGUFTensor(t.name, t.tensor_type, [int(d) for d in t.shape], t.data) for t in reader.tensors])
    if cached:
        _save(path, stamp, header, {t.name: int(t.data_offset) for t in reader.tensors})
    return header


def header_path(path: Path) -> Path:
    return path.with_name(path.name + SUFFIX)


def _stamp(path: Path) -> dict[str, Any]:
    stat = path.stat()
    return {"format": FORMAT, "gguf": version("gguf"), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _saved(path: Path, stamp: dict[str, Any]) -> GGUFHeader | None:
    saved = header_path(path)
    if not saved.is_file():
        return None
    try:
        data = json.loads(saved.read_text())
    except (OSError, ValueError):  # unreadable or half-copied by hand: parse again (and overwrite it)
        return None
    if data.get("stamp") != stamp:
        return None
    whole = np.memmap(path, dtype=np.uint8, mode="r")
    tensors = []
    for t in data["tensors"]:
        dtype = np.dtype(t["dtype"])
        count = int(np.prod(t["data_shape"], dtype=np.int64))
        raw = whole[t["offset"]:t["offset"] + count * dtype.itemsize]
        tensors.append(GGUFTensor(t["name"], QType(t["type"]), t["shape"], raw.view(dtype).reshape(t["data_shape"])))
    return GGUFHeader(data["metadata"], tensors)


def _save(path: Path, stamp: dict[str, Any], header: GGUFHeader, offsets: dict[str, int]) -> None:
    """Write the header beside `path` (to a temporary name, then renamed: never half-written). A folder that
    cannot be written only costs the next open a parse."""
    data = {"stamp": stamp, "metadata": header.metadata,
            "tensors": [{"name": t.name, "type": int(t.tensor_type), "shape": t.shape, "offset": offsets[t.name],
                         "dtype": t.data.dtype.str, "data_shape": list(t.data.shape)} for t in header.tensors]}
    target = header_path(path)
    try:
        fd, partial = tempfile.mkstemp(dir=target.parent, prefix=target.name, suffix=".partial")
    except OSError:
        return
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(data, out)
        os.replace(partial, target)
    except OSError:  # a full disk, say
        pass
    finally:  # gone after the rename; otherwise nothing half-written stays
        Path(partial).unlink(missing_ok=True)
