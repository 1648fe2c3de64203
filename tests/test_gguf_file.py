"""engine/model/gguf_file.py reads what gguf's own GGUFReader reads (metadata but the vocabulary's arrays, and
every tensor's name, shape, type and bytes), and refuses what is not a GGUF file."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from engine.model.checkpoint import bundled_model_path
from engine.model.gguf_file import SKIPPED_ARRAYS, read_gguf_file


def test_the_bundled_file_reads_as_gguf_reads_it() -> None:
    path = bundled_model_path()
    ours, theirs = read_gguf_file(path), gguf.GGUFReader(path)
    expected = {k: f.contents() for k, f in theirs.fields.items() if k not in SKIPPED_ARRAYS and not k.startswith("GGUF.")}
    assert ours.metadata.keys() == expected.keys()
    for key, value in expected.items():
        assert ours.metadata[key] == pytest.approx(value) if isinstance(value, float) else ours.metadata[key] == value, key
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(ours.tensors, theirs.tensors):
        assert a.shape == tuple(int(d) for d in b.shape) and a.tensor_type == b.tensor_type, a.name
        assert a.data.dtype == b.data.dtype and np.array_equal(a.data, b.data), a.name


def test_a_file_that_is_not_gguf_or_is_cut_short_is_refused(tmp_path) -> None:
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"PK\x03\x04" + bytes(64))
    with pytest.raises(ValueError, match="not a GGUF"):
        read_gguf_file(str(not_gguf))
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(open(bundled_model_path(), "rb").read()[:5_000_000])
    with pytest.raises(ValueError, match="past the end"):
        read_gguf_file(str(cut))
