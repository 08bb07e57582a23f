"""The saved GGUF header (ref_engine/model/gguf_header.py) against gguf's own reader: the same metadata, the
same tensors and the same bytes, and a fresh parse whenever the saved one may not describe the file."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QType

from ref_engine.model import gguf_header
from ref_engine.model.gguf_header import GGUFHeader, header_path, read_header


def write_small_gguf(path: Path) -> Path:
    """A small GGUF with metadata of every kind the loader reads and a tensor of each common storage type."""
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_bool("test.flag", True)
    writer.add_token_list(["<s>", "</s>", "a", "\u00e9t\u00e9"])
    writer.add_token_scores([0.0, -1.5, 2.25, 3.0])
    data = rng.standard_normal((4, 64)).astype(np.float32)
    for qtype in (QType.F32, QType.F16, QType.BF16, QType.Q8_0, QType.Q4_1):
        raw = data if qtype == QType.F32 else gguf.quants.quantize(data, qtype)
        writer.add_tensor(qtype.name, raw, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def cached_file(tmp_path, monkeypatch) -> Path:
    """A small GGUF in a cache folder of its own."""
    monkeypatch.setenv("SERVING_LAB_CACHE", str(tmp_path))
    return write_small_gguf(tmp_path / "small.gguf")


def parses(monkeypatch) -> list[str]:
    """Each GGUFReader made from now on, by path."""
    made: list[str] = []
    real = gguf.GGUFReader

    def counting(path, *args, **kwargs):
        made.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(gguf_header.gguf, "GGUFReader", counting)
    return made


def assert_same(saved: GGUFHeader, parsed: GGUFHeader) -> None:
    """`parsed` holds what GGUFReader gave (its metadata contents, its tensors' arrays)."""
    assert saved.metadata == parsed.metadata
    assert len(saved.tensors) == len(parsed.tensors)
    for ours, theirs in zip(saved.tensors, parsed.tensors, strict=True):
        assert (ours.name, ours.tensor_type, ours.shape) == (theirs.name, theirs.tensor_type, theirs.shape)
        assert ours.data.dtype == theirs.data.dtype and ours.data.shape == theirs.data.shape
        assert np.array_equal(ours.data, theirs.data), ours.name


def test_a_saved_header_reads_as_gguf_s_reader_does(cached_file, monkeypatch):
    made = parses(monkeypatch)
    parsed = read_header(cached_file)
    assert header_path(cached_file).is_file() and len(made) == 1
    saved = read_header(cached_file)
    assert len(made) == 1  # the second open did not parse
    assert_same(saved, parsed)
    assert {t.tensor_type for t in saved.tensors} == {QType.F32, QType.F16, QType.BF16, QType.Q8_0, QType.Q4_1}


@pytest.mark.slow
def test_the_default_model_s_saved_header_reads_as_gguf_s_reader_does(smollm2_path, tmp_path, monkeypatch):
    """The real vocabulary and merges (the slow part of the parse), through JSON and back."""
    monkeypatch.setenv("SERVING_LAB_CACHE", str(tmp_path))
    copy = Path(shutil.copy(smollm2_path, tmp_path / smollm2_path.name))
    parsed = read_header(copy)
    made = parses(monkeypatch)
    saved = read_header(copy)
    assert made == [] and len(saved.tensors) == 272
    assert_same(saved, parsed)


@pytest.mark.parametrize("change", ["file-touched", "header-garbled", "header-of-another-format"])
def test_a_saved_header_that_may_not_describe_the_file_is_parsed_again(cached_file, monkeypatch, change):
    read_header(cached_file)
    saved = header_path(cached_file)
    if change == "file-touched":
        stat = cached_file.stat()
        os.utime(cached_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    elif change == "header-garbled":
        saved.write_text(saved.read_text()[:100])
    else:
        monkeypatch.setattr(gguf_header, "FORMAT", gguf_header.FORMAT + 1)
    made = parses(monkeypatch)
    header = read_header(cached_file)
    assert len(made) == 1 and len(header.tensors) == 5
    made.clear()
    read_header(cached_file)  # and the fresh parse was saved in its place
    assert made == []


def test_a_file_outside_the_cache_folder_gets_nothing_written_beside_it(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVING_LAB_CACHE", str(tmp_path / "cache"))
    (tmp_path / "models").mkdir()
    path = write_small_gguf(tmp_path / "models" / "small.gguf")
    read_header(path)
    assert [p.name for p in path.parent.iterdir()] == ["small.gguf"]
