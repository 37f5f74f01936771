"""The engine's GGUF header reader against the gguf package's reader on the default model, and
its errors on damaged files."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGUFReader

from heteroserve_engines.cpu_engine.__main__ import default_model
from heteroserve_engines.cpu_engine.gguf_file import GGUFFile, GGUFFormatError


@pytest.fixture(scope="module")
def both():
    path = default_model()
    return GGUFFile.open(path), GGUFReader(path)


def test_metadata_equals_the_gguf_packages(both):
    ours, theirs = both
    assert set(ours.fields) == {k for k in theirs.fields if not k.startswith("GGUF.")}
    for key, field in theirs.fields.items():
        if key.startswith("GGUF."):  # the reader's pseudo-fields for the header
            continue
        expected = field.contents()
        assert ours.get(key) == expected, key
    assert len(ours.get("tokenizer.ggml.tokens")) == 49152


def test_tensor_directory_equals_the_gguf_packages(both):
    ours, theirs = both
    assert len(ours.tensors) == len(theirs.tensors)
    for a, b in zip(ours.tensors, theirs.tensors, strict=True):
        assert (a.name, a.shape, a.tensor_type, a.data_offset, a.n_bytes) == (
            b.name, tuple(int(x) for x in b.shape), b.tensor_type, int(b.data_offset),
            int(b.n_bytes))


@pytest.mark.parametrize("damage, message", [
    (lambda blob: b"GGUX" + blob[4:], "bad magic"),
    (lambda blob: blob[:4] + (7).to_bytes(4, "little") + blob[8:], "version 7"),
    (lambda blob: blob[:5000], "ends inside its header"),
    (lambda blob: blob[: len(blob) // 2], "past the end of the file"),
])
def test_damaged_files_are_clear_errors(tmp_path, damage, message):
    blob = Path(default_model()).read_bytes()
    path = tmp_path / "damaged.gguf"
    path.write_bytes(damage(blob))
    with pytest.raises(GGUFFormatError, match=message):
        GGUFFile.open(path)


def test_long_arrays_stay_raw_until_read_and_other_types_use_gguf_sizes(tmp_path):
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter, quants

    from heteroserve_engines.cpu_engine.gguf_file import BLOCKS, LAZY_ITEMS, RawArray

    path = tmp_path / "small.gguf"
    writer = GGUFWriter(str(path), "llama")
    words = [f"tok{i}·" for i in range(LAZY_ITEMS + 5)]
    writer.add_token_list(words)
    writer.add_token_types([1, 3] * 600)
    writer.add_array("short.list", ["a", "b"])
    q5 = quants.quantize(np.ones((2, 64), np.float32), GGMLQuantizationType.Q5_0)
    writer.add_tensor("q5.weight", q5, raw_dtype=GGMLQuantizationType.Q5_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ours = GGUFFile.open(path)
    assert isinstance(ours.fields["tokenizer.ggml.tokens"], RawArray)  # located, not read
    assert isinstance(ours.fields["tokenizer.ggml.token_type"], RawArray)
    assert ours.get("tokenizer.ggml.tokens") == words
    assert ours.get("tokenizer.ggml.token_type") == [1, 3] * 600
    assert ours.length("tokenizer.ggml.tokens") == len(words)
    assert ours.fields["short.list"] == ["a", "b"] and ours.length("short.list") == 2
    assert ours.length("missing") is None
    (tensor,) = ours.tensors
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType.Q5_0]
    assert tensor.tensor_type == GGMLQuantizationType.Q5_0
    assert tensor.n_bytes == 2 * 64 // block * size
    # the block sizes the engine keeps itself (so as not to import gguf) are gguf's
    for kind, sizes in BLOCKS.items():
        assert GGML_QUANT_SIZES[GGMLQuantizationType(kind)] == sizes
