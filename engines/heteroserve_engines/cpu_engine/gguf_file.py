"""GGUF metadata and tensor directory, read once into plain Python values.

The engine reads the header only: key/value metadata (decoded to str, int, float, bool and lists)
and where each tensor lies; the loader then maps each tensor's bytes. `gguf.GGUFReader` does the
same job but keeps a numpy view per metadata string - about 160 MiB for SmolLM2's 49,152-token
vocabulary and its merges, resident for as long as the reader lives - so the engine parses the
(small, versioned) header itself. Long arrays (the vocabulary, merges, token types: 14 MiB as
Python lists for SmolLM2) are only located while parsing, then read from the file and decoded
when asked for: a process that only loads weights never holds them. The block sizes of the types
the engine computes with are listed here; for the others the `gguf` package (and with it numpy)
is imported when such a file is opened. Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
(v2, v3).
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# GGUF value types -> struct format of one scalar
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
           11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
MAX_STRING = 1 << 24   # a metadata string longer than this is a corrupt file, not a template
MAX_ITEMS = 1 << 26
LAZY_ITEMS = 1024     # arrays longer than this are kept raw until read
# ggml type ids of the types the engine computes with (its own type ids are the same), and their
# (elements, bytes) per block
F32, F16, Q4_0, Q4_1, Q8_0 = 0, 1, 2, 3, 8
BLOCKS = {F32: (1, 4), F16: (1, 2), Q4_0: (32, 18), Q4_1: (32, 20), Q8_0: (32, 34)}


class GGUFFormatError(ValueError):
    """The file is not a GGUF file this reader understands."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]     # GGUF order: the row length (ne0) first
    tensor_type: int           # ggml type id (gguf.GGMLQuantizationType's values)
    data_offset: int           # from the start of the file
    n_bytes: int


@dataclass(frozen=True)
class RawArray:
    """A long metadata array: where it lies in the file; `decode()` reads it into a list."""
    path: Path
    item: int
    count: int
    offset: int
    size: int

    def decode(self) -> list[Any]:
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = _read(f, self.size)
        if self.item in SCALARS:
            return list(struct.unpack_from(f"<{self.count}{SCALARS[self.item][1]}", data))
        out, at = [], 0
        for _ in range(self.count):  # strings: u64 length, then the bytes
            (n,) = struct.unpack_from("<Q", data, at)
            out.append(data[at + 8:at + 8 + n].decode("utf-8", errors="replace"))
            at += 8 + n
        return out


@dataclass(frozen=True)
class GGUFFile:
    path: Path
    version: int
    fields: dict[str, Any]
    tensors: list[TensorInfo]

    def get(self, key: str, default: Any = None) -> Any:
        value = self.fields.get(key, default)
        return value.decode() if isinstance(value, RawArray) else value

    def length(self, key: str) -> int | None:
        """Items of an array field without decoding it; None when the key is absent."""
        value = self.fields.get(key)
        if value is None:
            return None
        return value.count if isinstance(value, RawArray) else len(value)

    @classmethod
    def open(cls, path: str | Path) -> GGUFFile:
        path = Path(path)
        with path.open("rb") as f:
            size = path.stat().st_size
            return _parse(path, f, size)


def _read(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise GGUFFormatError("file ends inside its header")
    return data


def _scalar(f: BinaryIO, fmt: str) -> Any:
    return struct.unpack(fmt, _read(f, struct.calcsize(fmt)))[0]


def _string(f: BinaryIO) -> str:
    n = _scalar(f, "<Q")
    if n > MAX_STRING:
        raise GGUFFormatError(f"a metadata string claims {n} bytes")
    return _read(f, n).decode("utf-8", errors="replace")


def _value(f: BinaryIO, kind: int, size: int) -> Any:
    """One metadata value; `size`: the file's, which a skipped array must not pass."""
    if kind in SCALARS:
        return _scalar(f, SCALARS[kind])
    if kind == STRING:
        return _string(f)
    if kind == ARRAY:
        item, count = _scalar(f, "<I"), _scalar(f, "<Q")
        if count > MAX_ITEMS:
            raise GGUFFormatError(f"a metadata array claims {count} items")
        start = f.tell()
        if item in SCALARS:  # one read for the whole array
            fmt = SCALARS[item]
            width = struct.calcsize(fmt) * count
            if count > LAZY_ITEMS:
                if start + width > size:
                    raise GGUFFormatError("file ends inside its header")
                f.seek(width, 1)
                return RawArray(Path(f.name), item, count, start, width)
            return list(struct.unpack(f"<{count}{fmt[1]}", _read(f, width)))
        if item == STRING and count > LAZY_ITEMS:
            for _ in range(count):  # only walk the lengths
                n = _scalar(f, "<Q")
                if n > MAX_STRING:
                    raise GGUFFormatError(f"a metadata string claims {n} bytes")
                f.seek(n, 1)
            if f.tell() > size:
                raise GGUFFormatError("file ends inside its header")
            return RawArray(Path(f.name), item, count, start, f.tell() - start)
        return [_value(f, item, size) for _ in range(count)]
    raise GGUFFormatError(f"unknown metadata value type {kind}")


def _parse(path: Path, f: BinaryIO, size: int) -> GGUFFile:
    if _read(f, 4) != MAGIC:
        raise GGUFFormatError("not a GGUF file (bad magic)")
    version = _scalar(f, "<I")
    if version not in (2, 3):
        raise GGUFFormatError(f"GGUF version {version} is not supported (2, 3)")
    n_tensors, n_kv = _scalar(f, "<Q"), _scalar(f, "<Q")
    if n_tensors > MAX_ITEMS or n_kv > MAX_ITEMS:
        raise GGUFFormatError("implausible tensor or metadata count")
    fields: dict[str, Any] = {}
    for _ in range(n_kv):
        key = _string(f)
        fields[key] = _value(f, _scalar(f, "<I"), size)
    infos = []
    for _ in range(n_tensors):
        name = _string(f)
        n_dims = _scalar(f, "<I")
        if n_dims > 4:
            raise GGUFFormatError(f"tensor {name} has {n_dims} dimensions")
        shape = tuple(_scalar(f, "<Q") for _ in range(n_dims))
        kind, offset = _scalar(f, "<I"), _scalar(f, "<Q")
        infos.append((name, shape, kind, offset))
    alignment = int(fields.get("general.alignment", DEFAULT_ALIGNMENT))
    if alignment <= 0 or alignment & (alignment - 1):
        raise GGUFFormatError(f"general.alignment {alignment} is not a power of two")
    start = -(-f.tell() // alignment) * alignment
    tensors = []
    for name, shape, kind, offset in infos:
        block, type_size = _block_size(name, kind)
        elements = 1
        for dim in shape:
            elements *= dim
        if shape and shape[0] % block:
            raise GGUFFormatError(f"tensor {name}: rows of {shape[0]} are not whole blocks")
        n_bytes = elements // block * type_size
        if start + offset + n_bytes > size:
            raise GGUFFormatError(f"tensor {name} lies past the end of the file")
        tensors.append(TensorInfo(name, shape, kind, start + offset, n_bytes))
    return GGUFFile(path, version, fields, tensors)


def _block_size(name: str, kind: int) -> tuple[int, int]:
    if kind in BLOCKS:
        return BLOCKS[kind]
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        return GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
    except (ValueError, KeyError):
        raise GGUFFormatError(f"tensor {name} has unknown type {kind}") from None


# Tensors whose leading bytes stand for the weights in a model's identity (with every tensor's
# name, type and shape): reading the whole file would take seconds for a large model.
IDENTITY_TENSORS = ("token_embd.weight", "output_norm.weight", "blk.0.attn_k.weight",
                    "blk.0.attn_v.weight")
IDENTITY_SAMPLE_BYTES = 1 << 20


def weights_identity(reader: GGUFFile) -> dict[str, Any]:
    """What identifies the weights of a GGUF file, for the KV hand-off's model fingerprint
    (`protocol.kv.model_fingerprint`): the same file gives the same identity in every engine,
    whatever it requantizes to; another model, or another quantization of the file, does not."""
    digest = hashlib.sha256()
    by_name = {t.name: t for t in reader.tensors}
    with reader.path.open("rb") as f:
        for name in IDENTITY_TENSORS:
            tensor = by_name.get(name)
            if tensor is not None:
                f.seek(tensor.data_offset)
                digest.update(f.read(min(tensor.n_bytes, IDENTITY_SAMPLE_BYTES)))
    return {"architecture": reader.get("general.architecture"),
            "tensors": [[t.name, t.tensor_type, list(t.shape)] for t in reader.tensors],
            "samples": digest.hexdigest()}
